/*
 * tidclash: threads whose ids share a per-thread slot of bpf/nvidia_dev.bpf.c (tid mod SLOTS),
 * to drive its rarely taken paths with real threads and real ioctls.
 *
 * usage: tidclash PATH SLOTS N
 *   Waits for "go" on stdin, opens PATH, then:
 *   1. thread A does N ioctl(FIONREAD) and exits (its counts stay unflushed in its slot);
 *   2. thread S blocks inside ioctl(FIONBIO) on a page registered with userfaultfd and never
 *      served (a real ioctl that does not return), and keeps its slot busy;
 *   3. threads are created until one has a tid in A's slot (B) and one in S's slot (C), each
 *      does N ioctl(FIONREAD): B takes A's idle slot over, C must use the overflow map.
 *   Prints "done <fd> <tidA> <tidS> <tidB> <tidC>" and waits for another line.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

static int fd;
static long n, slots;
static void *page;

struct job { long want_slot; int tid; int hit; };

static void spin_ioctls(void) {
    int avail;
    for (long i = 0; i < n; i++) ioctl(fd, FIONREAD, &avail);
}

static void *plain(void *arg) {
    struct job *j = arg;
    j->tid = gettid();
    spin_ioctls();
    return NULL;
}

static void *stall(void *arg) {
    struct job *j = arg;
    j->tid = gettid();
    ioctl(fd, FIONBIO, page);   /* never returns */
    return NULL;
}

static void *maybe(void *arg) {   /* does the ioctls only if its tid lands in the wanted slot */
    struct job *j = arg;
    j->tid = gettid();
    if (j->tid % slots == j->want_slot) {
        j->hit = 1;
        spin_ioctls();
    }
    return NULL;
}

static int clash(long slot) {
    for (int tries = 0; tries < 4 * slots + 100; tries++) {
        struct job j = {.want_slot = slot};
        pthread_t t;
        if (pthread_create(&t, NULL, maybe, &j)) return -1;
        pthread_join(t, NULL);
        if (j.hit) return j.tid;
    }
    return -1;
}

int main(int argc, char **argv) {
    if (argc < 4) { fprintf(stderr, "usage: tidclash PATH SLOTS N\n"); return 2; }
    slots = atol(argv[2]);
    n = atol(argv[3]);
    int uffd = syscall(SYS_userfaultfd, O_CLOEXEC);
    if (uffd < 0) { printf("error userfaultfd %d\n", errno); return 1; }
    struct uffdio_api api = {.api = UFFD_API};
    if (ioctl(uffd, UFFDIO_API, &api)) { printf("error UFFDIO_API %d\n", errno); return 1; }
    page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    struct uffdio_register reg = {.range = {.start = (unsigned long)page, .len = 4096},
                                  .mode = UFFDIO_REGISTER_MODE_MISSING};
    if (ioctl(uffd, UFFDIO_REGISTER, &reg)) { printf("error UFFDIO_REGISTER %d\n", errno); return 1; }
    printf("ready %d\n", getpid());
    fflush(stdout);
    char line[64];
    if (!fgets(line, sizeof line, stdin)) return 3;
    fd = open(argv[1], O_RDONLY);
    if (fd < 0) { printf("error open %d\n", errno); return 1; }
    struct job a = {0}, s = {0};
    pthread_t ta, ts;
    pthread_create(&ta, NULL, plain, &a);
    pthread_join(ta, NULL);
    pthread_create(&ts, NULL, stall, &s);
    while (!__atomic_load_n(&s.tid, __ATOMIC_SEQ_CST)) usleep(1000);
    usleep(100000);               /* let S enter the ioctl */
    int b = clash(a.tid % slots);
    int c = clash(s.tid % slots);
    printf("done %d %d %d %d %d\n", fd, a.tid, s.tid, b, c);
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin)) return 0;
    return 0;
}
