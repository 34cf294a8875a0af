/* Scad's interfaces/libd_trdma.h: the rdma interface is in libd.h (with Scad's names: libd_scad.h). */
#include "../../libd_scad.h"
