build2/sim/obj/driver_proc.o: sim/driver_proc.c sim/driver_internal.h \
 /usr/local/cuda/include/cuda.h sim/sim_config.h sim/simgpu.h
sim/driver_internal.h:
/usr/local/cuda/include/cuda.h:
sim/sim_config.h:
sim/simgpu.h:
