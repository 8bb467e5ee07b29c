/*
 * nvidia_dev: ioctls on fds of NVIDIA device nodes, counted and timed per process, fd and request.
 *
 * Why: a driver call that never returns sits in ioctl() (seed 000) and is visible only at the
 * syscall boundary. Which fds are device fds, and the opens with their errno (an EPERM from the
 * device cgroup, seed 002), come from the shared fd tracker (include/fdtrack.h). Only
 * tracepoint arguments and BPF helpers are read (no kernel structs).
 *
 * Cost: every ioctl on the node runs these programs, so the traced path avoids hash maps: a
 * per-thread slot (array, owner tid checked) holds the call in flight, a cache of "fd N is a
 * device fd" (valid while the process's fd generation is unchanged), and counts accumulated for
 * the last (fd, request) until that changes. By default calls are timed with the kernel tick
 * (bpf_jiffies64; the loader passes NVDEV_SLOW in ticks): two precise clock reads per call
 * cost more than the whole rest of the path, and every judgement made on these times (slow
 * >= 1 s, stalled >= 2 s) is far above a tick.
 *
 * Options (-D cflags, from tracing/nvidia_dev.py):
 *   NVDEV_JIFFIES   time with bpf_jiffies64() (ticks) instead of bpf_ktime_get_ns() (ns)
 *   NVDEV_SLOW      ioctls at least this long (in the clock's unit) produce an event when they
 *                   return (default 1 s in ns)
 *
 * Maps read by the loader:
 *   nvdev_events      ring buffer of struct nvdev_event (slow ioctls)
 *   nvdev_threads     per-thread slots: call in flight (ts != 0) and not yet flushed counts
 *   nvdev_inflight    calls in flight of threads whose slot another thread holds (ts != 0)
 *   nvdev_stats       (tgid, fd, request) -> count, total/max duration, errors (per CPU)
 *   nvdev_statinfo    (tgid, fd, request) -> comm and path
 */
#include "include/fdtrack.h"

#ifdef NVDEV_JIFFIES
#define NVDEV_NOW() bpf_jiffies64()
#else
#define NVDEV_NOW() bpf_ktime_get_ns()
#endif
#ifndef NVDEV_SLOW
#define NVDEV_SLOW 1000000000ULL
#endif

#define NVDEV_EV_SLOW_IOCTL 2
#define NVDEV_THREAD_SLOTS 4096

struct nvdev_statkey {
    u32 tgid;
    s32 fd;
    u32 cmd;
    u32 pad;
};

struct nvdev_stat {      /* per CPU: no atomics on the traced path; the loader sums */
    u64 count;
    u64 total;
    u64 max;
    u64 errors;
};

struct nvdev_statinfo {  /* once per (tgid, fd, request), shared by all CPUs */
    char comm[16];
    char path[FDT_FD_PATH_LEN];
};

struct nvdev_thread {
    u64 ts;              /* start of the call in flight, 0 when none */
    u32 tid;             /* owner of the slot */
    u32 tgid;
    s32 fd;
    u32 cmd;
    s32 cache_fd;        /* last fd found to be a device fd ... */
    u32 cache_gen;       /* ... while the process's fdt_proc.gen was this */
    u32 acc_tgid;        /* counts accumulated for (acc_tgid, acc_fd, acc_cmd) */
    s32 acc_fd;
    u32 acc_cmd;
    u32 pad;
    u64 count;
    u64 total;
    u64 max;
    u64 errors;
};

struct nvdev_call {
    u64 ts;
    s32 fd;
    u32 cmd;
};

struct nvdev_event {
    GD_EVENT_HEAD;   /* ts in the clock's unit */
    u64 duration;             /* in the clock's unit */
    s32 fd;
    u32 cmd;
    char path[FDT_FD_PATH_LEN];
};

BPF_RINGBUF_OUTPUT(nvdev_events, 16);
BPF_ARRAY(nvdev_threads, struct nvdev_thread, NVDEV_THREAD_SLOTS);
BPF_HASH(nvdev_inflight, u64, struct nvdev_call, 4096);
BPF_PERCPU_HASH(nvdev_stats, struct nvdev_statkey, struct nvdev_stat, 2048);
BPF_HASH(nvdev_statinfo, struct nvdev_statkey, struct nvdev_statinfo, 2048);
BPF_PERCPU_ARRAY(nvdev_info_scratch, struct nvdev_statinfo, 1);   /* off the 512-byte stack */
/* Device ioctls in flight node-wide (one counter): while none is, every ioctl exit on the
 * node returns at once, without even asking who is calling. */
BPF_ARRAY(nvdev_inflight_n, s64, 1);

static __always_inline void nvdev_add(struct nvdev_statkey *sk, u64 count, u64 total, u64 max,
                                      u64 errors)
{
    struct nvdev_stat *s = nvdev_stats.lookup(sk);
    if (!s) {
        struct nvdev_stat zero_stat = {};
        nvdev_stats.update(sk, &zero_stat);
        s = nvdev_stats.lookup(sk);
        if (!s)
            return;
    }
    s->count += count;
    s->total += total;
    if (max > s->max)
        s->max = max;
    s->errors += errors;
}

static __always_inline void nvdev_flush(struct nvdev_thread *t)
{
    struct nvdev_statkey sk = {.tgid = t->acc_tgid, .fd = t->acc_fd, .cmd = t->acc_cmd};
    nvdev_add(&sk, t->count, t->total, t->max, t->errors);
    t->count = 0;
}

/* comm and path of a (tgid, fd, request), noted by the calling thread the first time */
static __always_inline void nvdev_note(struct nvdev_statkey *sk)
{
    if (nvdev_statinfo.lookup(sk))
        return;
    u32 zero = 0;
    struct nvdev_statinfo *info = nvdev_info_scratch.lookup(&zero);
    if (!info)
        return;
    bpf_get_current_comm(info->comm, sizeof(info->comm));
    struct fdt_val *v = fdt_lookup(sk->tgid, sk->fd);
    if (v)
        __builtin_memcpy(info->path, v->path, sizeof(info->path));
    else
        __builtin_memset(info->path, 0, sizeof(info->path));
    nvdev_statinfo.update(sk, info);
}

static __always_inline void nvdev_slow(u64 id, u64 ts, u64 dur, s32 fd, u32 cmd, s64 ret)
{
    struct nvdev_event *e = nvdev_events.ringbuf_reserve(sizeof(struct nvdev_event));
    if (!e)
        return;
    GD_HEAD(e, NVDEV_EV_SLOW_IOCTL, ts, ret);
    e->duration = dur;
    e->fd = fd;
    e->cmd = cmd;
    struct nvdev_statkey sk = {.tgid = id >> 32, .fd = fd, .cmd = cmd};
    struct nvdev_statinfo *info = nvdev_statinfo.lookup(&sk);
    if (info)
        __builtin_memcpy(e->path, info->path, sizeof(e->path));
    else
        __builtin_memset(e->path, 0, sizeof(e->path));
    nvdev_events.ringbuf_submit(e, 0);
}

int nvdev_enter_ioctl(struct gd_sys_enter *args)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    u32 tid = (u32)id;
    struct fdt_proc *proc = fdt_proc_of(tgid);
    if (!proc || !proc->kinds[FDT_KIND_NVDEV])
        return 0;
    s32 fd = (s32)args->args[0];
    u32 slot = tid & (NVDEV_THREAD_SLOTS - 1);
    struct nvdev_thread *t = nvdev_threads.lookup(&slot);
    if (!t)
        return 0;
    int mine = t->tid == tid && t->tgid == tgid;
    if (!(mine && t->cache_fd == fd && t->cache_gen == proc->gen)) {
        u32 gen = proc->gen;   /* read before the lookup: a close in between invalidates */
        struct fdt_val *v = fdt_lookup(tgid, fd);
        if (!v || v->kind != FDT_KIND_NVDEV)
            return 0;
        if (!mine) {
            if (t->ts != 0) {
                /* the slot's owner is inside a call: keep ours in the overflow hash */
                struct nvdev_call c = {.ts = NVDEV_NOW(), .fd = fd, .cmd = (u32)args->args[1]};
                if (nvdev_inflight.update(&id, &c) != 0)
                    return 0;
                goto counted;
            }
            if (t->count)
                nvdev_flush(t);
            t->tid = tid;
            t->tgid = tgid;
        }
        t->cache_fd = fd;
        t->cache_gen = gen;
    }
    t->fd = fd;
    t->cmd = (u32)args->args[1];
    t->ts = NVDEV_NOW();
counted:;
    u32 zero = 0;
    s64 *n = nvdev_inflight_n.lookup(&zero);
    if (n)
        __sync_fetch_and_add(n, 1);
    return 0;
}

int nvdev_exit_ioctl(struct gd_sys_exit *args)
{
    u32 zero = 0;
    s64 *n = nvdev_inflight_n.lookup(&zero);
    if (!n || *n <= 0)
        return 0;
    u64 id = bpf_get_current_pid_tgid();
    u32 tid = (u32)id;
    u32 slot = tid & (NVDEV_THREAD_SLOTS - 1);
    struct nvdev_thread *t = nvdev_threads.lookup(&slot);
    if (!t)
        return 0;
    if (t->tid == tid && t->ts != 0) {
        __sync_fetch_and_add(n, -1);
        u64 dur = NVDEV_NOW() - t->ts;
        if (t->count && (t->acc_fd != t->fd || t->acc_cmd != t->cmd || t->acc_tgid != t->tgid))
            nvdev_flush(t);
        if (t->count == 0) {
            t->acc_tgid = t->tgid;
            t->acc_fd = t->fd;
            t->acc_cmd = t->cmd;
            t->total = 0;
            t->max = 0;
            t->errors = 0;
            struct nvdev_statkey sk = {.tgid = t->tgid, .fd = t->fd, .cmd = t->cmd};
            nvdev_note(&sk);
        }
        t->count++;
        t->total += dur;
        if (dur > t->max)
            t->max = dur;
        if (args->ret < 0)
            t->errors++;
        if (dur >= NVDEV_SLOW)
            nvdev_slow(id, t->ts, dur, t->fd, t->cmd, args->ret);
        t->ts = 0;
        return 0;
    }
    struct nvdev_call *c = nvdev_inflight.lookup(&id);
    if (!c || c->ts == 0)
        return 0;
    __sync_fetch_and_add(n, -1);
    u64 dur = NVDEV_NOW() - c->ts;
    struct nvdev_statkey sk = {.tgid = id >> 32, .fd = c->fd, .cmd = c->cmd};
    nvdev_note(&sk);
    nvdev_add(&sk, 1, dur, dur, args->ret < 0 ? 1 : 0);
    if (dur >= NVDEV_SLOW)
        nvdev_slow(id, c->ts, dur, c->fd, c->cmd, args->ret);
    nvdev_inflight.delete(&id);
    return 0;
}
