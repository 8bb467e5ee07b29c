/*
 * fdtrack.h: the one fd tracker every syscall program shares.
 *
 * Why one: which fds of which process name an NVIDIA device node or a device cgroup rule file
 * is the same bookkeeping for every program that looks at fds (opens, dup/dup2/dup3,
 * fcntl(F_DUPFD*), close). Kept once, each of those syscall tracepoints runs ONE prefilter for
 * the whole node, and the programs built on it (nvidia_dev: ioctls, cgroup_devices: rule
 * writes) only ask "is this fd tracked, and as what kind?". Only tracepoint arguments, user
 * memory and BPF helpers are read (no kernel structs: node headers may not match the kernel).
 *
 * Kinds (a tag per tracked path pattern; tracing/fdtrack.py reads these numbers from here):
 */
#ifndef GD_FDTRACK_H
#define GD_FDTRACK_H

#include "syscall_tp.h"
#include "event.h"

#define FDT_KIND_NVDEV 1            /* a path starting with FDT_NV_PREFIX */
#define FDT_KIND_CG_ALLOW 2         /* a file named devices.allow (cgroup v1) */
#define FDT_KIND_CG_DENY 3          /* a file named devices.deny */
#define FDT_KINDS 4                 /* every kind is below this */
#define FDT_FD_PATH_LEN 128         /* path kept per tracked fd */
#define FDT_OPEN_PATH_LEN 256       /* path reported per open */
#define FDT_TGID_SLOTS 65536
#define FDT_AT_FDCWD -100
#define FDT_F_DUPFD 0
#define FDT_F_DUPFD_CLOEXEC 1030

/* Options (-D cflags from tracing/fdtrack.py):
 *   FDT_NV_PREFIX   path prefix of the NVIDIA device nodes, a C string literal
 *   FDT_SELF_TGID   the loader's own process, never tracked */
#ifndef FDT_NV_PREFIX
#define FDT_NV_PREFIX "/dev/nvidia"
#endif
#ifndef FDT_SELF_TGID
#define FDT_SELF_TGID 0
#endif
#define FDT_NV_PLEN (sizeof(FDT_NV_PREFIX) - 1)

struct fdt_key {
    u32 tgid;
    s32 fd;
};

struct fdt_val {
    u64 open_ns;    /* the open's timestamp: joins later events (through dup'ed fds) to it */
    u32 kind;
    u32 pad;
    char path[FDT_FD_PATH_LEN];
};

/* Per tgid slot (collisions only cost the exact lookup): which kinds the process may hold
 * (one byte per kind, set with plain byte stores, never cleared), and a generation bumped
 * whenever one of its tracked fds goes away, so per-thread caches of "fd N is tracked"
 * (nvidia_dev) know when to ask fdt_fds again. */
struct fdt_proc {
    u8 kinds[FDT_KINDS];
    u32 gen;
};

struct fdt_pending_open {
    u64 ts;
    s32 dfd;
    u32 kind;
    char path[FDT_OPEN_PATH_LEN];
};

struct fdt_pending_dup {
    s32 oldfd;
    s32 newfd;   /* -1 for dup()/fcntl(): the new fd is the return value */
};

struct fdt_open_event {
    GD_EVENT_HEAD;   /* kind: the fd kind; ret: the new fd, or -errno */
    u64 duration_ns;
    s32 dfd;     /* the directory fd a relative path is relative to (FDT_AT_FDCWD: cwd) */
    u32 pad;
    char path[FDT_OPEN_PATH_LEN];   /* as the caller passed it */
};

BPF_RINGBUF_OUTPUT(fdt_events, 16);
BPF_HASH(fdt_fds, struct fdt_key, struct fdt_val, 16384);
BPF_HASH(fdt_open_pending, u64, struct fdt_pending_open, 4096);
BPF_HASH(fdt_dup_pending, u64, struct fdt_pending_dup, 4096);
BPF_ARRAY(fdt_procs, struct fdt_proc, FDT_TGID_SLOTS);
BPF_PERCPU_ARRAY(fdt_scratch, struct fdt_pending_open, 1);   /* off the 512-byte stack */
/* Opens of tracked paths between enter and exit, node-wide: while there are none, every
 * other open's exit returns without a hash lookup. */
BPF_ARRAY(fdt_opens_inflight, s64, 1);

static __always_inline struct fdt_proc *fdt_proc_of(u32 tgid)
{
    u32 slot = tgid & (FDT_TGID_SLOTS - 1);
    return fdt_procs.lookup(&slot);
}

/* May the process behind this slot hold a tracked fd (of any kind)? */
static __always_inline int fdt_may_hold_any(struct fdt_proc *p)
{
    return p && *(u32 *)p->kinds;
}

static __always_inline int fdt_may_hold(struct fdt_proc *p, u32 kind)
{
    return p && p->kinds[kind & (FDT_KINDS - 1)];
}

static __always_inline struct fdt_val *fdt_lookup(u32 tgid, s32 fd)
{
    struct fdt_key k = {.tgid = tgid, .fd = fd};
    return fdt_fds.lookup(&k);
}

static __always_inline void fdt_forget(u32 tgid, s32 fd, struct fdt_proc *p)
{
    struct fdt_key k = {.tgid = tgid, .fd = fd};
    if (fdt_fds.delete(&k) == 0 && p)
        p->gen++;   /* a lost increment between racing threads still changes it */
}

/* Which of devices.allow / devices.deny the path names (0: neither): its last path component,
 * compared as a few word loads instead of byte loops (cheaper to compile and to run). */
#define FDT_W_DEVICES 0x2e73656369766564ULL   /* "devices." little-endian */
#define FDT_W_ALLO 0x6f6c6c61U                /* "allo" */
#define FDT_W_DENY 0x796e6564U                /* "deny" */

static __always_inline u32 fdt_cgroup_kind(const char *s, long n)
{
    u64 end = (u64)n - 1;          /* index of the terminating NUL */
    u64 w8;
    u32 w4;
    u64 start = end - 13;          /* devices.allow */
    asm volatile("" : "+r"(start));
    if (end >= 13 && start <= FDT_OPEN_PATH_LEN - 14) {
        __builtin_memcpy(&w8, s + start, 8);
        __builtin_memcpy(&w4, s + start + 8, 4);
        if (w8 == FDT_W_DEVICES && w4 == FDT_W_ALLO && s[start + 12] == 'w' &&
            (start == 0 || s[start - 1] == '/'))
            return FDT_KIND_CG_ALLOW;
    }
    start = end - 12;              /* devices.deny */
    asm volatile("" : "+r"(start));
    if (end >= 12 && start <= FDT_OPEN_PATH_LEN - 13) {
        __builtin_memcpy(&w8, s + start, 8);
        __builtin_memcpy(&w4, s + start + 8, 4);
        if (w8 == FDT_W_DEVICES && w4 == FDT_W_DENY && (start == 0 || s[start - 1] == '/'))
            return FDT_KIND_CG_DENY;
    }
    return 0;
}

/* The kind of a path read with its NUL (n bytes), 0 if untracked. */
static __always_inline u32 fdt_classify(const char *s, long n)
{
    if (n > FDT_NV_PLEN) {
        const char prefix[] = FDT_NV_PREFIX;
        int same = 1;
#pragma unroll
        for (int i = 0; i < FDT_NV_PLEN; i++) {
            if (s[i] != prefix[i]) {
                same = 0;
                break;
            }
        }
        if (same)
            return FDT_KIND_NVDEV;
    }
    if (n > 12)
        return fdt_cgroup_kind(s, n);
    return 0;
}

static __always_inline int fdt_open_enter(int dfd, const char *filename)
{
    u64 id = bpf_get_current_pid_tgid();
    if ((id >> 32) == FDT_SELF_TGID)
        return 0;
    u32 zero = 0;
    struct fdt_pending_open *p = fdt_scratch.lookup(&zero);
    if (!p)
        return 0;
    long n = bpf_probe_read_user_str(p->path, sizeof(p->path), filename);
    if (n <= 1)
        return 0;
    u32 kind = fdt_classify(p->path, n);
    if (!kind)
        return 0;
    p->ts = bpf_ktime_get_ns();
    p->dfd = dfd;
    p->kind = kind;
    if (fdt_open_pending.update(&id, p) == 0) {
        s64 *n_open = fdt_opens_inflight.lookup(&zero);
        if (n_open)
            __sync_fetch_and_add(n_open, 1);
    }
    return 0;
}

static __always_inline int fdt_open_exit(long ret)
{
    u32 zero = 0;
    s64 *n_open = fdt_opens_inflight.lookup(&zero);
    if (!n_open || *n_open <= 0)
        return 0;
    u64 id = bpf_get_current_pid_tgid();
    struct fdt_pending_open *p = fdt_open_pending.lookup(&id);
    if (!p)
        return 0;
    __sync_fetch_and_add(n_open, -1);
    u32 tgid = id >> 32;
    if (ret >= 0) {
        struct fdt_key k = {.tgid = tgid, .fd = (s32)ret};
        struct fdt_val v = {.open_ns = p->ts, .kind = p->kind};
        __builtin_memcpy(v.path, p->path, sizeof(v.path));
        fdt_fds.update(&k, &v);
        struct fdt_proc *proc = fdt_proc_of(tgid);
        if (proc)
            proc->kinds[p->kind & (FDT_KINDS - 1)] = 1;
    }
    struct fdt_open_event *e = fdt_events.ringbuf_reserve(sizeof(struct fdt_open_event));
    if (e) {
        GD_HEAD(e, p->kind, p->ts, ret);
        e->duration_ns = bpf_ktime_get_ns() - p->ts;
        e->dfd = p->dfd;
        e->pad = 0;
        __builtin_memcpy(e->path, p->path, sizeof(e->path));
        fdt_events.ringbuf_submit(e, 0);
    }
    fdt_open_pending.delete(&id);
    return 0;
}

/* attached to sys_enter_openat and sys_enter_openat2 (same argument positions) */
int fdt_enter_open(struct gd_sys_enter *args)
{
    return fdt_open_enter((int)args->args[0], (const char *)args->args[1]);
}

/* attached to sys_enter_open where it exists (x86_64; C libraries before glibc 2.26) */
int fdt_enter_open_legacy(struct gd_sys_enter *args)
{
    return fdt_open_enter(FDT_AT_FDCWD, (const char *)args->args[0]);
}

/* attached to sys_exit_openat, sys_exit_openat2 and sys_exit_open */
int fdt_exit_open(struct gd_sys_exit *args)
{
    return fdt_open_exit(args->ret);
}

/* ---- dup family and close -------------------------------------------------------------- */

static __always_inline int fdt_dup_enter(s32 oldfd, s32 newfd)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    if (!fdt_may_hold_any(fdt_proc_of(tgid)))
        return 0;
    int tracked = fdt_lookup(tgid, oldfd) != 0;
    if (!tracked && newfd >= 0)   /* dup2/dup3 onto a tracked fd closes it: follow that too */
        tracked = fdt_lookup(tgid, newfd) != 0;
    if (!tracked)
        return 0;
    struct fdt_pending_dup d = {.oldfd = oldfd, .newfd = newfd};
    fdt_dup_pending.update(&id, &d);
    return 0;
}

static __always_inline int fdt_dup_exit(long ret)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    struct fdt_proc *proc = fdt_proc_of(tgid);
    if (!fdt_may_hold_any(proc))
        return 0;
    struct fdt_pending_dup *d = fdt_dup_pending.lookup(&id);
    if (!d)
        return 0;
    if (ret >= 0 && (s32)ret != d->oldfd) {
        struct fdt_val *v = fdt_lookup(tgid, d->oldfd);
        if (v) {
            struct fdt_key newk = {.tgid = tgid, .fd = (s32)ret};
            struct fdt_val copy = {};
            __builtin_memcpy(&copy, v, sizeof(copy));
            fdt_fds.update(&newk, &copy);
        } else {
            fdt_forget(tgid, (s32)ret, proc);
        }
    }
    fdt_dup_pending.delete(&id);
    return 0;
}

int fdt_enter_dup(struct gd_sys_enter *args)
{
    return fdt_dup_enter((s32)args->args[0], -1);
}

/* attached to sys_enter_dup2 and sys_enter_dup3 */
int fdt_enter_dup2(struct gd_sys_enter *args)
{
    return fdt_dup_enter((s32)args->args[0], (s32)args->args[1]);
}

int fdt_enter_fcntl(struct gd_sys_enter *args)
{
    if (args->args[1] != FDT_F_DUPFD && args->args[1] != FDT_F_DUPFD_CLOEXEC)
        return 0;
    return fdt_dup_enter((s32)args->args[0], -1);
}

/* attached to sys_exit_dup, sys_exit_dup2, sys_exit_dup3 and sys_exit_fcntl */
int fdt_exit_dup(struct gd_sys_exit *args)
{
    return fdt_dup_exit(args->ret);
}

int fdt_enter_close(struct gd_sys_enter *args)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    struct fdt_proc *proc = fdt_proc_of(tgid);
    if (!fdt_may_hold_any(proc))
        return 0;
    fdt_forget(tgid, (s32)args->args[0], proc);
    return 0;
}

#endif /* GD_FDTRACK_H */
