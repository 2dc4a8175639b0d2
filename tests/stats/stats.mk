# tests/stats/stats.mk — tests of `oomguard stats` and of the cluster recipes
# (docs/clusters.md).  Included from tools/tools.mk.
#
#   test-stats   build what the tests need and run tests/stats/run_tests.sh
#                (ends with "N passed, N failed")

# One rank of a simulated multi-node job, for the stand-in launcher.
$(B)/tests/stats_rank_job: tests/stats/rank_job.c $(SIM_LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -Isim $< -o $@ -L$(SIM_LIBDIR) -Wl,-rpath-link,$(SIM_LIBDIR) -lcudart -ldl

.PHONY: test-stats
test-stats: $(B)/oomguard $(B)/liboomguard.so $(SIM_LIBS) $(B)/tests/stats_rank_job $(B)/cli-test/og-measure  ## oomguard stats, Prometheus format and the cluster recipes only
	@B=$(B) SANITIZE=$(SANITIZE) bash tests/stats/run_tests.sh
