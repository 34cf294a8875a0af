/* Scad's interfaces/libd_trdma_server.h: the rdma_server interface is in libd.h. */
#include "../../libd_scad.h"
