/*
 * nvml_caller: loads libnvidia-ml.so.1 from the path given (dlopen by path, as go-nvml does
 * after its own lookup), announces itself, waits for a line on stdin, then calls nvmlInit_v2.
 * With the test library configured init=block that call never returns (a real futex wait).
 */
#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: nvml_caller LIBPATH\n"); return 2; }
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) { printf("error %s\n", dlerror()); return 1; }
    int (*init)(void) = (int (*)(void))dlsym(h, "nvmlInit_v2");
    if (!init) { printf("error no nvmlInit_v2\n"); return 1; }
    printf("ready %d\n", getpid());
    fflush(stdout);
    char line[64];
    if (!fgets(line, sizeof line, stdin)) return 3;
    printf("calling\n");
    fflush(stdout);
    int rc = init();
    printf("returned %d\n", rc);
    fflush(stdout);
    return 0;
}
