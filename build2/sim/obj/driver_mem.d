build2/sim/obj/driver_mem.o: sim/driver_mem.c sim/driver_internal.h \
 /usr/local/cuda/include/cuda.h sim/sim_config.h sim/simgpu.h
sim/driver_internal.h:
/usr/local/cuda/include/cuda.h:
sim/sim_config.h:
sim/simgpu.h:
