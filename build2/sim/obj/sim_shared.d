build2/sim/obj/sim_shared.o: sim/sim_shared.c sim/sim_config.h
sim/sim_config.h:
