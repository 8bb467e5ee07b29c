/*
 * cgroup_devices: who rewrites device cgroup rules, and what they write.
 *
 * Why: on cgroup v1 a runtime (or kubelet's CPU manager through it) updates a container by
 * writing "a" to devices.deny and then its allow list to devices.allow; if that list lacks the
 * NVIDIA devices, the container loses its GPUs with no log line anywhere (seed 001). On cgroup
 * v2 the same happens by attaching a BPF_CGROUP_DEVICE program through bpf(). This program
 * reports opens of files named devices.allow / devices.deny, the text written through those
 * fds (following dup/dup2/dup3/fcntl(F_DUPFD*): shells write through a dup'ed fd), and
 * bpf(BPF_PROG_ATTACH / BPF_PROG_DETACH / BPF_LINK_CREATE) of cgroup device programs.
 * Only syscall tracepoint arguments, user memory and BPF helpers are read (no kernel structs).
 *
 * Options (-D cflags):
 *   CGDEV_SELF_TGID   the loader's own process, ignored (its bpf() calls are the loading itself)
 *
 * Maps read by the loader:
 *   cgdev_events   ring buffer of struct cgdev_event (open / write / bpf attach)
 */
#ifndef CGDEV_SELF_TGID
#define CGDEV_SELF_TGID 0
#endif

#define CGDEV_PATH_LEN 256
#define CGDEV_TEXT_LEN 256
#define CGDEV_EV_OPEN 1
#define CGDEV_EV_WRITE 2
#define CGDEV_EV_BPF 3
#define CGDEV_ALLOW 1
#define CGDEV_DENY 2
#define CGDEV_F_DUPFD 0
#define CGDEV_F_DUPFD_CLOEXEC 1030
#define CGDEV_BPF_PROG_ATTACH 8
#define CGDEV_BPF_PROG_DETACH 9
#define CGDEV_BPF_LINK_CREATE 28
#define CGDEV_BPF_CGROUP_DEVICE 6

/* Syscall tracepoint records as tracefs describes them (events/syscalls/<name>/format): an
 * 8-byte common header, the syscall number, then the six arguments (enter) or the return value
 * (exit), each 8 bytes. A fixed ABI of kernel/trace/trace_syscalls.c, not a kernel struct from
 * headers; the loader checks the offsets against tracefs before attaching. Declared here rather
 * than through BCC's generated tracepoint structs so the programs can share one compile. */
struct cgdev_sys_enter {
    u64 common;
    s32 nr;
    u32 pad;
    u64 args[6];
};

struct cgdev_sys_exit {
    u64 common;
    s32 nr;
    u32 pad;
    s64 ret;
};

struct cgdev_fdkey {
    u32 tgid;
    s32 fd;
};

struct cgdev_fdval {
    u64 open_id;   /* the open's timestamp: joins writes (even through dup'ed fds) to opens */
    u32 which;     /* CGDEV_ALLOW / CGDEV_DENY */
    u32 pad;
};

struct cgdev_pending_open {
    u64 ts;
    s32 dfd;
    u32 which;
    char path[CGDEV_PATH_LEN];
};

struct cgdev_pending_dup {
    s32 oldfd;
    s32 newfd;
};

struct cgdev_pending_write {
    u64 ts;
    u64 open_id;
    s32 fd;
    u32 which;
    u32 len;
    u32 pad;
    char text[CGDEV_TEXT_LEN];
};

struct cgdev_pending_bpf {
    u64 ts;
    s32 cmd;
    u32 attach_type;
    s32 target_fd;
    u32 flags;
};

struct cgdev_event {
    u64 ts;
    u64 open_id;
    u64 cgroup_id;
    u32 kind;
    u32 pid;
    u32 tid;
    s32 ret;
    s32 fd;        /* open: the new fd; write: the fd written; bpf: the target cgroup fd */
    s32 dfd;       /* open: the directory fd the path is relative to (-100: cwd) */
    u32 which;     /* allow / deny */
    u32 len;       /* write: bytes asked to write (text holds up to CGDEV_TEXT_LEN) */
    s32 bpf_cmd;
    u32 attach_type;
    u32 flags;
    u32 pad;
    char comm[16];
    char text[CGDEV_TEXT_LEN];   /* open: the path as passed; write: the rule text */
};

BPF_RINGBUF_OUTPUT(cgdev_events, 16);
BPF_HASH(cgdev_open_pending, u64, struct cgdev_pending_open, 1024);
BPF_HASH(cgdev_fds, struct cgdev_fdkey, struct cgdev_fdval, 4096);
BPF_HASH(cgdev_dup_pending, u64, struct cgdev_pending_dup, 1024);
BPF_HASH(cgdev_write_pending, u64, struct cgdev_pending_write, 1024);
BPF_HASH(cgdev_bpf_pending, u64, struct cgdev_pending_bpf, 256);
BPF_PERCPU_ARRAY(cgdev_scratch, struct cgdev_pending_open, 1);
/* Prefilter for the hot syscalls (write, close, dup*): "may this process hold an fd on a
 * devices.allow/deny file?" by tgid slot; set on such opens, never cleared. Array lookups are
 * inlined, so other processes' writes cost almost nothing beyond the tracepoint itself. */
#define CGDEV_TGID_SLOTS 65536
BPF_ARRAY(cgdev_tgid_has_fds, u8, CGDEV_TGID_SLOTS);

static __always_inline int cgdev_may_have_fds(u32 tgid)
{
    u32 slot = tgid & (CGDEV_TGID_SLOTS - 1);
    u8 *f = cgdev_tgid_has_fds.lookup(&slot);
    return f && *f;
}

/* Which of devices.allow / devices.deny the path names (0: neither): its last path component,
 * compared as a few word loads instead of byte loops (cheaper to compile and to run). */
#define CGDEV_W_DEVICES 0x2e73656369766564ULL   /* "devices." little-endian */
#define CGDEV_W_ALLO 0x6f6c6c61U                /* "allo" */
#define CGDEV_W_DENY 0x796e6564U                /* "deny" */

static __always_inline u32 cgdev_which(const char *s, long n)
{
    u64 end = (u64)n - 1;          /* index of the terminating NUL */
    u64 w8;
    u32 w4;
    u64 start = end - 13;          /* devices.allow */
    asm volatile("" : "+r"(start));
    if (end >= 13 && start <= CGDEV_PATH_LEN - 14) {
        __builtin_memcpy(&w8, s + start, 8);
        __builtin_memcpy(&w4, s + start + 8, 4);
        if (w8 == CGDEV_W_DEVICES && w4 == CGDEV_W_ALLO && s[start + 12] == 'w' &&
            (start == 0 || s[start - 1] == '/'))
            return CGDEV_ALLOW;
    }
    start = end - 12;              /* devices.deny */
    asm volatile("" : "+r"(start));
    if (end >= 12 && start <= CGDEV_PATH_LEN - 13) {
        __builtin_memcpy(&w8, s + start, 8);
        __builtin_memcpy(&w4, s + start + 8, 4);
        if (w8 == CGDEV_W_DEVICES && w4 == CGDEV_W_DENY && (start == 0 || s[start - 1] == '/'))
            return CGDEV_DENY;
    }
    return 0;
}

static __always_inline int cgdev_open_enter(int dfd, const char *filename)
{
    u64 id = bpf_get_current_pid_tgid();
    if ((id >> 32) == CGDEV_SELF_TGID)
        return 0;
    u32 zero = 0;
    struct cgdev_pending_open *p = cgdev_scratch.lookup(&zero);
    if (!p)
        return 0;
    long n = bpf_probe_read_user_str(p->path, sizeof(p->path), filename);
    if (n <= 12)
        return 0;
    u32 which = cgdev_which(p->path, n);
    if (!which)
        return 0;
    p->ts = bpf_ktime_get_ns();
    p->dfd = dfd;
    p->which = which;
    cgdev_open_pending.update(&id, p);
    return 0;
}

static __always_inline int cgdev_open_exit(long ret)
{
    u64 id = bpf_get_current_pid_tgid();
    struct cgdev_pending_open *p = cgdev_open_pending.lookup(&id);
    if (!p)
        return 0;
    if (ret >= 0) {
        struct cgdev_fdkey k = {.tgid = id >> 32, .fd = (s32)ret};
        struct cgdev_fdval v = {.open_id = p->ts, .which = p->which};
        cgdev_fds.update(&k, &v);
        u32 slot = (u32)(id >> 32) & (CGDEV_TGID_SLOTS - 1);
        u8 one = 1;
        cgdev_tgid_has_fds.update(&slot, &one);
    }
    struct cgdev_event *e = cgdev_events.ringbuf_reserve(sizeof(struct cgdev_event));
    if (e) {
        __builtin_memset(e, 0, sizeof(*e));
        e->ts = p->ts;
        e->open_id = p->ts;
        e->cgroup_id = bpf_get_current_cgroup_id();
        e->kind = CGDEV_EV_OPEN;
        e->pid = id >> 32;
        e->tid = (u32)id;
        e->ret = (s32)ret;
        e->fd = (s32)ret;
        e->dfd = p->dfd;
        e->which = p->which;
        bpf_get_current_comm(e->comm, sizeof(e->comm));
        __builtin_memcpy(e->text, p->path, sizeof(e->text));
        cgdev_events.ringbuf_submit(e, 0);
    }
    cgdev_open_pending.delete(&id);
    return 0;
}

/* attached to sys_enter_openat and sys_enter_openat2 (same argument positions) */
int cgdev_enter_open(struct cgdev_sys_enter *args)
{
    return cgdev_open_enter((int)args->args[0], (const char *)args->args[1]);
}

/* attached to sys_enter_open where it exists (x86_64; old C libraries) */
int cgdev_enter_open_legacy(struct cgdev_sys_enter *args)
{
    return cgdev_open_enter(-100 /* AT_FDCWD */, (const char *)args->args[0]);
}

/* attached to sys_exit_openat, sys_exit_openat2 and sys_exit_open */
int cgdev_exit_open(struct cgdev_sys_exit *args)
{
    return cgdev_open_exit(args->ret);
}

/* ---- fd bookkeeping ------------------------------------------------------------------------ */

static __always_inline int cgdev_dup_enter(s32 oldfd, s32 newfd)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!cgdev_may_have_fds(id >> 32))
        return 0;
    struct cgdev_fdkey k = {.tgid = id >> 32, .fd = oldfd};
    int tracked = cgdev_fds.lookup(&k) != 0;
    if (!tracked && newfd >= 0) {
        k.fd = newfd;
        tracked = cgdev_fds.lookup(&k) != 0;
    }
    if (!tracked)
        return 0;
    struct cgdev_pending_dup d = {.oldfd = oldfd, .newfd = newfd};
    cgdev_dup_pending.update(&id, &d);
    return 0;
}

static __always_inline int cgdev_dup_exit(long ret)
{
    u64 id = bpf_get_current_pid_tgid();
    struct cgdev_pending_dup *d = cgdev_dup_pending.lookup(&id);
    if (!d)
        return 0;
    if (ret >= 0 && (s32)ret != d->oldfd) {
        struct cgdev_fdkey oldk = {.tgid = id >> 32, .fd = d->oldfd};
        struct cgdev_fdkey newk = {.tgid = id >> 32, .fd = (s32)ret};
        struct cgdev_fdval *v = cgdev_fds.lookup(&oldk);
        if (v) {
            struct cgdev_fdval copy = *v;
            cgdev_fds.update(&newk, &copy);
        } else {
            cgdev_fds.delete(&newk);
        }
    }
    cgdev_dup_pending.delete(&id);
    return 0;
}

int cgdev_enter_dup(struct cgdev_sys_enter *args)
{
    return cgdev_dup_enter((s32)args->args[0], -1);
}

/* attached to sys_exit_dup, sys_exit_dup2, sys_exit_dup3 and sys_exit_fcntl */
int cgdev_exit_dup(struct cgdev_sys_exit *args)
{
    return cgdev_dup_exit(args->ret);
}

/* attached to sys_enter_dup2 and sys_enter_dup3 */
int cgdev_enter_dup2(struct cgdev_sys_enter *args)
{
    return cgdev_dup_enter((s32)args->args[0], (s32)args->args[1]);
}

int cgdev_enter_fcntl(struct cgdev_sys_enter *args)
{
    if (args->args[1] != CGDEV_F_DUPFD && args->args[1] != CGDEV_F_DUPFD_CLOEXEC)
        return 0;
    return cgdev_dup_enter((s32)args->args[0], -1);
}

int cgdev_enter_close(struct cgdev_sys_enter *args)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (!cgdev_may_have_fds(tgid))
        return 0;
    struct cgdev_fdkey k = {.tgid = tgid, .fd = (s32)args->args[0]};
    cgdev_fds.delete(&k);
    return 0;
}

/* ---- writes of rule text ------------------------------------------------------------------- */

int cgdev_enter_write(struct cgdev_sys_enter *args)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!cgdev_may_have_fds(id >> 32))
        return 0;
    struct cgdev_fdkey k = {.tgid = id >> 32, .fd = (s32)args->args[0]};
    struct cgdev_fdval *v = cgdev_fds.lookup(&k);
    if (!v)
        return 0;
    struct cgdev_pending_write w = {};
    w.ts = bpf_ktime_get_ns();
    w.open_id = v->open_id;
    w.fd = (s32)args->args[0];
    w.which = v->which;
    w.len = (u32)args->args[2];
    u64 n = w.len < CGDEV_TEXT_LEN - 1 ? w.len : CGDEV_TEXT_LEN - 1;
    asm volatile("" : "+r"(n));   /* keep the mask below: the verifier needs to see the bound */
    n &= CGDEV_TEXT_LEN - 1;
    bpf_probe_read_user(w.text, n, (const void *)args->args[1]);
    cgdev_write_pending.update(&id, &w);
    return 0;
}

int cgdev_exit_write(struct cgdev_sys_exit *args)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!cgdev_may_have_fds(id >> 32))
        return 0;
    struct cgdev_pending_write *w = cgdev_write_pending.lookup(&id);
    if (!w)
        return 0;
    struct cgdev_event *e = cgdev_events.ringbuf_reserve(sizeof(struct cgdev_event));
    if (e) {
        __builtin_memset(e, 0, sizeof(*e));
        e->ts = w->ts;
        e->open_id = w->open_id;
        e->cgroup_id = bpf_get_current_cgroup_id();
        e->kind = CGDEV_EV_WRITE;
        e->pid = id >> 32;
        e->tid = (u32)id;
        e->ret = (s32)args->ret;
        e->fd = w->fd;
        e->which = w->which;
        e->len = w->len;
        bpf_get_current_comm(e->comm, sizeof(e->comm));
        __builtin_memcpy(e->text, w->text, sizeof(e->text));
        cgdev_events.ringbuf_submit(e, 0);
    }
    cgdev_write_pending.delete(&id);
    return 0;
}

/* ---- cgroup v2: bpf() attaching device programs --------------------------------------------- */

int cgdev_enter_bpf(struct cgdev_sys_enter *args)
{
    int cmd = (int)args->args[0];
    if (cmd != CGDEV_BPF_PROG_ATTACH && cmd != CGDEV_BPF_PROG_DETACH &&
        cmd != CGDEV_BPF_LINK_CREATE)
        return 0;
    u64 id = bpf_get_current_pid_tgid();
    if ((id >> 32) == CGDEV_SELF_TGID)
        return 0;
    /* union bpf_attr is uapi (user memory, stable layout):
     *   PROG_ATTACH/DETACH: u32 target_fd, attach_bpf_fd, attach_type, attach_flags
     *   LINK_CREATE:        u32 prog_fd, target_fd, attach_type, flags                */
    u32 attr[4] = {};
    if (bpf_probe_read_user(attr, sizeof(attr), (const void *)args->args[1]) != 0)
        return 0;
    if (attr[2] != CGDEV_BPF_CGROUP_DEVICE)
        return 0;
    struct cgdev_pending_bpf b = {};
    b.ts = bpf_ktime_get_ns();
    b.cmd = cmd;
    b.attach_type = attr[2];
    b.target_fd = cmd == CGDEV_BPF_LINK_CREATE ? (s32)attr[1] : (s32)attr[0];
    b.flags = attr[3];
    cgdev_bpf_pending.update(&id, &b);
    return 0;
}

int cgdev_exit_bpf(struct cgdev_sys_exit *args)
{
    u64 id = bpf_get_current_pid_tgid();
    struct cgdev_pending_bpf *b = cgdev_bpf_pending.lookup(&id);
    if (!b)
        return 0;
    struct cgdev_event *e = cgdev_events.ringbuf_reserve(sizeof(struct cgdev_event));
    if (e) {
        __builtin_memset(e, 0, sizeof(*e));
        e->ts = b->ts;
        e->cgroup_id = bpf_get_current_cgroup_id();
        e->kind = CGDEV_EV_BPF;
        e->pid = id >> 32;
        e->tid = (u32)id;
        e->ret = (s32)args->ret;
        e->fd = b->target_fd;
        e->bpf_cmd = b->cmd;
        e->attach_type = b->attach_type;
        e->flags = b->flags;
        bpf_get_current_comm(e->comm, sizeof(e->comm));
        cgdev_events.ringbuf_submit(e, 0);
    }
    cgdev_bpf_pending.delete(&id);
    return 0;
}
