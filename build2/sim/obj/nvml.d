build2/sim/obj/nvml.o: sim/nvml.c sim/nvml_sim.h sim/sim_config.h \
 sim/simgpu.h
sim/nvml_sim.h:
sim/sim_config.h:
sim/simgpu.h:
