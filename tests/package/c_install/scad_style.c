/* A program written against Scad's libd, unchanged: Scad's headers, struct types, state numbers and
 * void *libd_trdma_reg. Built with pkg-config libd-scad (the compatibility headers). */
#include <stdio.h>
#include <string.h>

#include "libd.h"
#include "interfaces/libd_trdma.h"

int main(void) {
    struct libd_action *action = libd_action_init("scad-program", 0, NULL);
    if (libd_action_add_transport(action, "mem;local;size,4096") != 0) return 1;
    struct libd_transport *trans = libd_action_get_transport(action, "mem");
    if (libd_transport_query(trans) == LIBD_TRANS_STATE_INIT) libd_transport_init(trans);
    if (libd_transport_query(trans) == LIBD_TRANS_STATE_INITD) libd_transport_connect(trans);
    if (libd_transport_query(trans) != LIBD_TRANS_STATE_READY) {
        fprintf(stderr, "state %d, not LIBD_TRANS_STATE_READY\n", libd_transport_query(trans));
        return 1;
    }
    char *buf = libd_trdma_reg(trans, 1024, NULL);
    if (buf == NULL) return 1;
    strcpy(buf, "scad");
    if (libd_trdma_write(trans, 5, 0, buf) != 0) return 1;
    memset(buf, 0, 1024);
    if (libd_trdma_read(trans, 5, 0, buf + 100) != 0 || strcmp(buf + 100, "scad") != 0) return 1;
    libd_transport_terminate(trans);
    if (libd_transport_query(trans) != LIBD_TRANS_STATE_TERMINATED) return 1;
    libd_action_free(action);
    printf("scad-style: ok\n");
    return 0;
}
