/*
 * cuda_caller: a CUDA program's first driver calls, against the libcuda.so.1 given by path.
 * Loads it (dlopen by path), prints "ready PID", waits for a line on stdin, then calls cuInit(0)
 * and, if that worked, cuDeviceGet, cuDevicePrimaryCtxRetain and cuMemAlloc_v2; prints
 * "results <init> <get> <retain> <alloc>" (-1: not called) and waits for another line.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>

typedef int (*init_fn)(unsigned int);
typedef int (*get_fn)(int *, int);
typedef int (*retain_fn)(void **, int);
typedef int (*alloc_fn)(unsigned long long *, size_t);

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: cuda_caller LIBPATH\n"); return 2; }
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) { printf("error %s\n", dlerror()); return 1; }
    init_fn init = (init_fn)dlsym(h, "cuInit");
    get_fn get = (get_fn)dlsym(h, "cuDeviceGet");
    retain_fn retain = (retain_fn)dlsym(h, "cuDevicePrimaryCtxRetain");
    alloc_fn alloc = (alloc_fn)dlsym(h, "cuMemAlloc_v2");
    if (!init || !get || !retain || !alloc) { printf("error missing symbols\n"); return 1; }
    printf("ready %d\n", getpid());
    fflush(stdout);
    char line[64];
    if (!fgets(line, sizeof line, stdin)) return 3;
    int rc_init = init(0), rc_get = -1, rc_retain = -1, rc_alloc = -1;
    if (rc_init == 0) {
        int dev = -1;
        void *ctx = 0;
        unsigned long long p = 0;
        rc_get = get(&dev, 0);
        rc_retain = retain(&ctx, dev);
        rc_alloc = alloc(&p, 1 << 20);
    }
    printf("results %d %d %d %d\n", rc_init, rc_get, rc_retain, rc_alloc);
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin)) return 0;
    return 0;
}
