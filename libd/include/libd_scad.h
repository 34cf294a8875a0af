/* libd_scad.h: Scad's names for libd's calls, for C programs written against Scad's libd.
 *
 * Opt-in: include it (or build with `pkg-config --cflags libd-scad`, whose include folder holds a
 * libd.h and interfaces/libd_trdma*.h that include it) and a program written for Scad compiles
 * unchanged. It adds, on top of the native API (libd.h, which stays as it is):
 *
 *   LIBD_TRANS_STATE_*          Scad's state numbers (INIT 0, INITD, CONNECT, READY, ERROR,
 *                               TERMINATED), not the native bit flags LIBD_STATE_*
 *   libd_transport_query(t)     the transport's state as one of those numbers
 *   void *libd_trdma_reg(t, size, buf)
 *                               Scad's registration: returns the buffer (buf, or one the library
 *                               allocates when buf is NULL), NULL on failure; it replaces the
 *                               native int libd_trdma_reg(t, size, void **buf) in this file's
 *                               includers, so do not include it where native calls are used.
 *
 * Everything else Scad programs call (libd_action_*, libd_transport_init/connect/recover/
 * terminate, libd_trdma_read/write, libd_trdma_server_serve) has the same name and meaning
 * natively. Scad's struct fields (trans->tstate, ...) were never an interface and are not here.
 */
#ifndef LIBD_SCAD_H
#define LIBD_SCAD_H

#include "libd.h"

#ifdef __cplusplus
extern "C" {
#endif

enum {
    LIBD_TRANS_STATE_ACTION = -3,
    LIBD_TRANS_STATE_TRANSIT = -2,
    LIBD_TRANS_STATE_ANY = -1,
    LIBD_TRANS_STATE_INIT = 0,
    LIBD_TRANS_STATE_INITD,
    LIBD_TRANS_STATE_CONNECT,
    LIBD_TRANS_STATE_READY,
    LIBD_TRANS_STATE_ERROR,
    LIBD_TRANS_STATE_TERMINATED
};

/* A native state (LIBD_STATE_*) as Scad's number; a negative errno stays as it is. */
static inline int libd_scad_state(int native) {
    switch (native) {
    case LIBD_STATE_INIT: return LIBD_TRANS_STATE_INIT;
    case LIBD_STATE_INITD: return LIBD_TRANS_STATE_INITD;
    case LIBD_STATE_READY: return LIBD_TRANS_STATE_READY;
    case LIBD_STATE_ERROR: return LIBD_TRANS_STATE_ERROR;
    case LIBD_STATE_TERMINATED: return LIBD_TRANS_STATE_TERMINATED;
    default: return native;
    }
}

static inline int libd_transport_query(libd_transport *trans) {
    return libd_scad_state(libd_transport_state(trans));
}

/* Calls the native registration (declared in libd.h) before the macro below renames the name. */
static inline void *libd_scad_trdma_reg(libd_transport *trans, size_t size, void *buf) {
    void *b = buf;
    return libd_trdma_reg(trans, size, &b) == 0 ? b : (void *)0;
}
#define libd_trdma_reg libd_scad_trdma_reg

#ifdef __cplusplus
}
#endif

#endif /* LIBD_SCAD_H */
