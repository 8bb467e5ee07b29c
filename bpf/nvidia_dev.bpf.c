/*
 * nvidia_dev: opens of NVIDIA device nodes and the ioctls made on the fds those opens returned.
 *
 * Why: a container whose device cgroup lacks a device gets EPERM from open() (seed 002) and
 * logs nothing; a driver call that never returns sits in ioctl() (seed 000). Both are visible
 * only at the syscall boundary. Only syscall tracepoint arguments and BPF helpers are read here
 * (no kernel structs: node headers may not match the running kernel).
 *
 * Options (-D cflags):
 *   NVDEV_PREFIX       path prefix to match, a C string literal (default "/dev/nvidia")
 *   NVDEV_SLOW_NS      ioctls at least this long produce an event when they return (default 1 s)
 *   NVDEV_SELF_TGID    the loader's own process, ignored (default 0)
 *
 * Maps read by the loader:
 *   nvdev_events   ring buffer of struct nvdev_event (opens with their result, slow ioctls)
 *   nvdev_fds      (tgid, fd) -> path of device fds, following dup/dup2/dup3/fcntl(F_DUPFD*)
 *                  and close; the loader may seed it with fds opened before attach
 *   nvdev_inflight thread -> its last ioctl on a tracked fd; in progress while ts != 0
 *   nvdev_tgid_has_fds  tgid slot -> 1 if the process may hold a tracked fd (a prefilter)
 *   nvdev_stats    (tgid, fd, request) -> count, total/max latency, errors (per CPU)
 *   nvdev_statinfo (tgid, fd, request) -> comm and path
 */
#ifndef NVDEV_PREFIX
#define NVDEV_PREFIX "/dev/nvidia"
#endif
#ifndef NVDEV_SLOW_NS
#define NVDEV_SLOW_NS 1000000000ULL
#endif
#ifndef NVDEV_SELF_TGID
#define NVDEV_SELF_TGID 0
#endif

#define NVDEV_PATH_LEN 128
#define NVDEV_PLEN (sizeof(NVDEV_PREFIX) - 1)
#define NVDEV_EV_OPEN 1
#define NVDEV_EV_SLOW_IOCTL 2
#define NVDEV_F_DUPFD 0
#define NVDEV_F_DUPFD_CLOEXEC 1030

/* Syscall tracepoint records as tracefs describes them (events/syscalls/<name>/format): an
 * 8-byte common header, the syscall number, then the six arguments (enter) or the return value
 * (exit), each 8 bytes. A fixed ABI of kernel/trace/trace_syscalls.c, not a kernel struct from
 * headers; the loader checks the offsets against tracefs before attaching. Declared here rather
 * than through BCC's generated tracepoint structs so the programs can share one compile. */
struct nvdev_sys_enter {
    u64 common;
    s32 nr;
    u32 pad;
    u64 args[6];
};

struct nvdev_sys_exit {
    u64 common;
    s32 nr;
    u32 pad;
    s64 ret;
};

struct nvdev_fdkey {
    u32 tgid;
    s32 fd;
};

struct nvdev_fdval {
    u64 open_ns;
    char path[NVDEV_PATH_LEN];
};

struct nvdev_pending_open {
    u64 ts;
    char path[NVDEV_PATH_LEN];
};

struct nvdev_pending_dup {
    s32 oldfd;
    s32 newfd;   /* -1 for dup()/fcntl(): the new fd is the return value */
};

struct nvdev_call {
    u64 ts;
    s32 fd;
    u32 cmd;
};

struct nvdev_statkey {
    u32 tgid;
    s32 fd;
    u32 cmd;
    u32 pad;
};

struct nvdev_stat {      /* per CPU: no atomics on the traced path; the loader sums */
    u64 count;
    u64 total_ns;
    u64 max_ns;
    u64 errors;
};

struct nvdev_statinfo {  /* once per (tgid, fd, request), shared by all CPUs */
    char comm[16];
    char path[NVDEV_PATH_LEN];
};

struct nvdev_event {
    u64 ts;
    u64 cgroup_id;
    u64 duration_ns;
    u32 kind;
    u32 pid;
    u32 tid;
    s32 ret;
    s32 fd;
    u32 cmd;
    char comm[16];
    char path[NVDEV_PATH_LEN];
};

BPF_RINGBUF_OUTPUT(nvdev_events, 16);
BPF_HASH(nvdev_open_pending, u64, struct nvdev_pending_open, 4096);
BPF_HASH(nvdev_fds, struct nvdev_fdkey, struct nvdev_fdval, 16384);
BPF_HASH(nvdev_dup_pending, u64, struct nvdev_pending_dup, 4096);
BPF_HASH(nvdev_inflight, u64, struct nvdev_call, 16384);
BPF_PERCPU_HASH(nvdev_stats, struct nvdev_statkey, struct nvdev_stat, 2048);
BPF_HASH(nvdev_statinfo, struct nvdev_statkey, struct nvdev_statinfo, 2048);
BPF_PERCPU_ARRAY(nvdev_info_scratch, struct nvdev_statinfo, 1);   /* off the 512-byte stack */
/* A cheap first filter for the hot syscalls (ioctl, close, dup*): "may this process hold a
 * tracked fd?", by tgid slot (collisions only cost the exact lookup). Set on every tracked open
 * (and by the loader for fds it seeds), never cleared. Array lookups are inlined by the
 * verifier, so a process without device fds pays almost nothing beyond the tracepoint itself. */
#define NVDEV_TGID_SLOTS 65536
BPF_ARRAY(nvdev_tgid_has_fds, u8, NVDEV_TGID_SLOTS);

/* How many tracked ioctls are in flight right now (one counter): while none is, every
 * ioctl exit on the node returns at once, without even asking who is calling. */
BPF_ARRAY(nvdev_inflight_n, s64, 1);

static __always_inline int nvdev_may_have_fds(u32 tgid)
{
    u32 slot = tgid & (NVDEV_TGID_SLOTS - 1);
    u8 *f = nvdev_tgid_has_fds.lookup(&slot);
    return f && *f;
}

static __always_inline int nvdev_open_enter(const char *filename)
{
    u64 id = bpf_get_current_pid_tgid();
    if ((id >> 32) == NVDEV_SELF_TGID)
        return 0;
    /* Cheap test first: only the prefix's bytes; the whole path only on a match. */
    const char prefix[] = NVDEV_PREFIX;
    char head[sizeof(NVDEV_PREFIX)] = {};
    if (bpf_probe_read_user(head, NVDEV_PLEN, filename) != 0)
        return 0;
#pragma unroll
    for (int i = 0; i < NVDEV_PLEN; i++) {
        if (head[i] != prefix[i])
            return 0;
    }
    struct nvdev_pending_open p = {};
    p.ts = bpf_ktime_get_ns();
    bpf_probe_read_user_str(p.path, sizeof(p.path), filename);
    nvdev_open_pending.update(&id, &p);
    return 0;
}

static __always_inline int nvdev_open_exit(long ret)
{
    u64 id = bpf_get_current_pid_tgid();
    struct nvdev_pending_open *p = nvdev_open_pending.lookup(&id);
    if (!p)
        return 0;
    if (ret >= 0) {
        struct nvdev_fdkey k = {.tgid = id >> 32, .fd = (s32)ret};
        struct nvdev_fdval v = {};
        v.open_ns = p->ts;
        __builtin_memcpy(v.path, p->path, sizeof(v.path));
        nvdev_fds.update(&k, &v);
        u32 slot = (u32)(id >> 32) & (NVDEV_TGID_SLOTS - 1);
        u8 one = 1;
        nvdev_tgid_has_fds.update(&slot, &one);
    }
    struct nvdev_event *e = nvdev_events.ringbuf_reserve(sizeof(struct nvdev_event));
    if (e) {
        e->ts = p->ts;
        e->cgroup_id = bpf_get_current_cgroup_id();
        e->duration_ns = bpf_ktime_get_ns() - p->ts;
        e->kind = NVDEV_EV_OPEN;
        e->pid = id >> 32;
        e->tid = (u32)id;
        e->ret = (s32)ret;
        e->fd = ret >= 0 ? (s32)ret : -1;
        e->cmd = 0;
        bpf_get_current_comm(e->comm, sizeof(e->comm));
        __builtin_memcpy(e->path, p->path, sizeof(e->path));
        nvdev_events.ringbuf_submit(e, 0);
    }
    nvdev_open_pending.delete(&id);
    return 0;
}

/* attached to sys_enter_openat and sys_enter_openat2 (same argument positions) */
int nvdev_enter_open(struct nvdev_sys_enter *args)
{
    return nvdev_open_enter((const char *)args->args[1]);
}

/* attached to sys_enter_open where it exists (x86_64; glibc < 2.26, e.g. CentOS 7 images) */
int nvdev_enter_open_legacy(struct nvdev_sys_enter *args)
{
    return nvdev_open_enter((const char *)args->args[0]);
}

/* attached to sys_exit_openat, sys_exit_openat2 and sys_exit_open */
int nvdev_exit_open(struct nvdev_sys_exit *args)
{
    return nvdev_open_exit(args->ret);
}

/* ---- fd bookkeeping: dup family and close ------------------------------------------------ */

static __always_inline int nvdev_dup_enter(s32 oldfd, s32 newfd)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!nvdev_may_have_fds(id >> 32))
        return 0;
    struct nvdev_fdkey k = {.tgid = id >> 32, .fd = oldfd};
    int tracked = nvdev_fds.lookup(&k) != 0;
    if (!tracked && newfd >= 0) {
        /* dup2/dup3 onto a tracked fd closes it: follow that too. */
        k.fd = newfd;
        tracked = nvdev_fds.lookup(&k) != 0;
    }
    if (!tracked)
        return 0;
    struct nvdev_pending_dup d = {.oldfd = oldfd, .newfd = newfd};
    nvdev_dup_pending.update(&id, &d);
    return 0;
}

static __always_inline int nvdev_dup_exit(long ret)
{
    u64 id = bpf_get_current_pid_tgid();
    struct nvdev_pending_dup *d = nvdev_dup_pending.lookup(&id);
    if (!d)
        return 0;
    if (ret >= 0 && (s32)ret != d->oldfd) {
        struct nvdev_fdkey oldk = {.tgid = id >> 32, .fd = d->oldfd};
        struct nvdev_fdkey newk = {.tgid = id >> 32, .fd = (s32)ret};
        struct nvdev_fdval *v = nvdev_fds.lookup(&oldk);
        if (v) {
            struct nvdev_fdval copy = {};
            __builtin_memcpy(&copy, v, sizeof(copy));
            nvdev_fds.update(&newk, &copy);
        } else {
            nvdev_fds.delete(&newk);
        }
    }
    nvdev_dup_pending.delete(&id);
    return 0;
}

int nvdev_enter_dup(struct nvdev_sys_enter *args)
{
    return nvdev_dup_enter((s32)args->args[0], -1);
}

/* attached to sys_exit_dup, sys_exit_dup2, sys_exit_dup3 and sys_exit_fcntl */
int nvdev_exit_dup(struct nvdev_sys_exit *args)
{
    return nvdev_dup_exit(args->ret);
}

/* attached to sys_enter_dup2 and sys_enter_dup3 */
int nvdev_enter_dup2(struct nvdev_sys_enter *args)
{
    return nvdev_dup_enter((s32)args->args[0], (s32)args->args[1]);
}

int nvdev_enter_fcntl(struct nvdev_sys_enter *args)
{
    if (args->args[1] != NVDEV_F_DUPFD && args->args[1] != NVDEV_F_DUPFD_CLOEXEC)
        return 0;
    return nvdev_dup_enter((s32)args->args[0], -1);
}

int nvdev_enter_close(struct nvdev_sys_enter *args)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (!nvdev_may_have_fds(tgid))
        return 0;
    struct nvdev_fdkey k = {.tgid = tgid, .fd = (s32)args->args[0]};
    nvdev_fds.delete(&k);
    return 0;
}

/* ---- ioctls on tracked fds ----------------------------------------------------------------- */

int nvdev_enter_ioctl(struct nvdev_sys_enter *args)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!nvdev_may_have_fds(id >> 32))
        return 0;
    struct nvdev_fdkey k = {.tgid = id >> 32, .fd = (s32)args->args[0]};
    if (!nvdev_fds.lookup(&k))
        return 0;
    /* One slot per thread, reused in place (a hash update + delete per call costs more);
     * ts != 0 marks a call in flight. */
    struct nvdev_call *c = nvdev_inflight.lookup(&id);
    if (c) {
        c->fd = (s32)args->args[0];
        c->cmd = (u32)args->args[1];
        c->ts = bpf_ktime_get_ns();
    } else {
        struct nvdev_call n = {.ts = bpf_ktime_get_ns(), .fd = (s32)args->args[0],
                               .cmd = (u32)args->args[1]};
        if (nvdev_inflight.update(&id, &n) != 0)
            return 0;
    }
    u32 zero = 0;
    s64 *n_inflight = nvdev_inflight_n.lookup(&zero);
    if (n_inflight)
        __sync_fetch_and_add(n_inflight, 1);
    return 0;
}

int nvdev_exit_ioctl(struct nvdev_sys_exit *args)
{
    u32 zero = 0;
    s64 *n_inflight = nvdev_inflight_n.lookup(&zero);
    if (!n_inflight || *n_inflight <= 0)
        return 0;
    u64 id = bpf_get_current_pid_tgid();
    if (!nvdev_may_have_fds(id >> 32))
        return 0;
    struct nvdev_call *c = nvdev_inflight.lookup(&id);
    if (!c || c->ts == 0)
        return 0;
    __sync_fetch_and_add(n_inflight, -1);
    u64 now = bpf_ktime_get_ns();
    u64 dur = now - c->ts;
    struct nvdev_statkey sk = {.tgid = id >> 32, .fd = c->fd, .cmd = c->cmd};
    struct nvdev_stat *s = nvdev_stats.lookup(&sk);
    if (!s) {
        struct nvdev_stat zero_stat = {};
        nvdev_stats.update(&sk, &zero_stat);
        s = nvdev_stats.lookup(&sk);
        if (!s)
            goto out;
    }
    if (s->count == 0 && !nvdev_statinfo.lookup(&sk)) {   /* first call of this kind */
        struct nvdev_statinfo *info = nvdev_info_scratch.lookup(&zero);
        if (info) {
            bpf_get_current_comm(info->comm, sizeof(info->comm));
            struct nvdev_fdkey k = {.tgid = id >> 32, .fd = c->fd};
            struct nvdev_fdval *v = nvdev_fds.lookup(&k);
            if (v)
                __builtin_memcpy(info->path, v->path, sizeof(info->path));
            else
                __builtin_memset(info->path, 0, sizeof(info->path));
            nvdev_statinfo.update(&sk, info);
        }
    }
    s->count++;
    s->total_ns += dur;
    if (dur > s->max_ns)
        s->max_ns = dur;
    if (args->ret < 0)
        s->errors++;
    if (dur >= NVDEV_SLOW_NS) {
        struct nvdev_event *e = nvdev_events.ringbuf_reserve(sizeof(struct nvdev_event));
        if (e) {
            e->ts = c->ts;
            e->cgroup_id = bpf_get_current_cgroup_id();
            e->duration_ns = dur;
            e->kind = NVDEV_EV_SLOW_IOCTL;
            e->pid = id >> 32;
            e->tid = (u32)id;
            e->ret = (s32)args->ret;
            e->fd = c->fd;
            e->cmd = c->cmd;
            bpf_get_current_comm(e->comm, sizeof(e->comm));
            struct nvdev_statinfo *info = nvdev_statinfo.lookup(&sk);
            if (info)
                __builtin_memcpy(e->path, info->path, sizeof(e->path));
            else
                __builtin_memset(e->path, 0, sizeof(e->path));
            nvdev_events.ringbuf_submit(e, 0);
        }
    }
out:
    c->ts = 0;
    return 0;
}
