/*
 * devio: a test process that opens a path, follows it with dup/fcntl, issues ioctls on it, and
 * can block inside an ioctl for real. Used by tests/tracing to drive bpf/nvidia_dev.bpf.c.
 *
 * usage: devio PATH MODE [N]
 *   Waits for one line on stdin ("go") before acting, so the tracer can attach first.
 *   MODE count: open PATH, dup it with fcntl(F_DUPFD) and dup2, then N ioctl(FIONREAD) on the
 *               dup2'ed fd and N on the F_DUPFD one; prints "done <fd> <dupfd> <dup2fd>".
 *   MODE stall: open PATH, then ioctl(fd, FIONBIO, p) where p is a page registered with
 *               userfaultfd and never served: the kernel's get_user() in the ioctl waits for
 *               the fault forever (a real ioctl that does not return, as a hung driver call).
 *               Prints "stalling <fd>" right before the ioctl.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

static void wait_go(void) {
    char line[64];
    if (!fgets(line, sizeof line, stdin)) exit(3);
}

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: devio PATH count|stall [N]\n"); return 2; }
    const char *path = argv[1], *mode = argv[2];
    long n = argc > 3 ? atol(argv[3]) : 100;
    printf("ready %d\n", getpid());
    fflush(stdout);
    if (!strcmp(mode, "stall")) {
        int uffd = syscall(SYS_userfaultfd, O_CLOEXEC);
        if (uffd < 0) { printf("error userfaultfd %d\n", errno); return 1; }
        struct uffdio_api api = {.api = UFFD_API};
        if (ioctl(uffd, UFFDIO_API, &api)) { printf("error UFFDIO_API %d\n", errno); return 1; }
        void *page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        struct uffdio_register reg = {.range = {.start = (unsigned long)page, .len = 4096},
                                      .mode = UFFDIO_REGISTER_MODE_MISSING};
        if (ioctl(uffd, UFFDIO_REGISTER, &reg)) { printf("error UFFDIO_REGISTER %d\n", errno); return 1; }
        wait_go();
        int fd = open(path, O_RDONLY);
        if (fd < 0) { printf("error open %d\n", errno); return 1; }
        printf("stalling %d\n", fd);
        fflush(stdout);
        ioctl(fd, FIONBIO, page);
        printf("returned\n");
        return 0;
    }
    wait_go();
    int fd = open(path, O_RDONLY);
    if (fd < 0) { printf("error open %d\n", errno); return 1; }
    int dupfd = fcntl(fd, F_DUPFD, 20);
    int dup2fd = dup2(fd, 30);
    close(fd);
    int avail;
    for (long i = 0; i < n; i++) ioctl(dup2fd, FIONREAD, &avail);
    for (long i = 0; i < n; i++) ioctl(dupfd, FIONREAD, &avail);
    printf("done %d %d %d\n", fd, dupfd, dup2fd);
    fflush(stdout);
    wait_go();
    return 0;
}
