/* Built against the installed libd only (pkg-config libd, or find_package(libd)): hosts an element
 * through a server transport, writes and reads it over tcp and shm, and checks the bytes. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <libd.h>

#define CHECK(call)                                                                          \
    do {                                                                                     \
        int rc_ = (call);                                                                    \
        if (rc_ < 0) {                                                                       \
            fprintf(stderr, "%s: %s (%s)\n", #call, libd_last_error(), libd_strerror(rc_)); \
            return 1;                                                                        \
        }                                                                                    \
    } while (0)

int main(void) {
    char durl[256], config[1024], client[1280];
    snprintf(durl, sizeof durl, "pool;tcp_server;size,0;path,/tmp/libd-c-install-%d.sock;capacity,1MiB", (int)getpid());
    libd_action *host = libd_action_init("host", 0, NULL);
    CHECK(libd_action_add_transport(host, durl));
    libd_transport *pool = libd_action_get_transport(host, "pool");
    CHECK(libd_trdma_server_serve(pool));
    CHECK(libd_trdma_server_add_element(pool, "e", 65536));
    libd_grant_spec spec = {"e", "reader", 0, 0, LIBD_RIGHT_READ | LIBD_RIGHT_WRITE, 0};
    CHECK(libd_trdma_server_grant_ex(pool, &spec, config, sizeof config));

    const char *impls[] = {"tcp", "shm"};
    for (int i = 0; i < 2; i++) {
        libd_action *a = libd_action_init("reader", 0, NULL);
        snprintf(client, sizeof client, "m;%s;%s", impls[i], config);
        CHECK(libd_action_add_transport(a, client));
        libd_transport *t = libd_action_get_transport(a, "m");
        char *buf = NULL;
        CHECK(libd_trdma_reg(t, 4096, (void **)&buf));
        snprintf(buf, 64, "hello over %s", impls[i]);
        CHECK(libd_trdma_write(t, 64, 128, buf));
        memset(buf, 0, 4096);
        CHECK(libd_trdma_read(t, 64, 128, buf + 1024));
        if (strncmp(buf + 1024, "hello over ", 11) != 0 || strcmp(buf + 1035, impls[i]) != 0) {
            fprintf(stderr, "read back '%s'\n", buf + 1024);
            return 1;
        }
        libd_action_free(a);
    }
    libd_server_attr attr;
    CHECK(libd_trdma_server_query(pool, &attr));
    if (attr.used_bytes != 65536 || attr.capacity != 1 << 20) {
        fprintf(stderr, "query: used %llu capacity %llu\n", (unsigned long long)attr.used_bytes,
                (unsigned long long)attr.capacity);
        return 1;
    }
    libd_action_free(host);
    printf("native: ok (libd %d.%d)\n", LIBD_VERSION_MAJOR, LIBD_VERSION_MINOR);
    return 0;
}
