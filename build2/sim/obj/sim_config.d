build2/sim/obj/sim_config.o: sim/sim_config.c sim/sim_config.h
sim/sim_config.h:
