/*
 * cgroup_devices: who rewrites device cgroup rules, and what they write.
 *
 * Why: on cgroup v1 a runtime (or kubelet's CPU manager through it) updates a container by
 * writing "a" to devices.deny and then its allow list to devices.allow; if that list lacks the
 * NVIDIA devices, the container loses its GPUs with no log line anywhere (seed 001). On cgroup
 * v2 the same happens by attaching a BPF_CGROUP_DEVICE program through bpf(). Opens of files
 * named devices.allow / devices.deny, and the fds they live on through dup/dup2/dup3/fcntl
 * (shells write through a dup'ed fd), come from the shared fd tracker (include/fdtrack.h); this
 * program adds the text written through those fds and bpf(BPF_PROG_ATTACH / BPF_PROG_DETACH /
 * BPF_LINK_CREATE) of cgroup device programs. Only syscall tracepoint arguments, user memory
 * and BPF helpers are read (no kernel structs).
 *
 * Options (-D cflags): FDT_SELF_TGID (the fd tracker's) also keeps the loader's own bpf()
 * calls, which are the loading itself, out.
 *
 * Maps read by the loader:
 *   cgdev_events   ring buffer of struct cgdev_event (write / bpf attach)
 */
#include "include/fdtrack.h"

#define CGDEV_TEXT_LEN 256
#define CGDEV_EV_WRITE 2
#define CGDEV_EV_BPF 3
#define CGDEV_BPF_PROG_ATTACH 8
#define CGDEV_BPF_PROG_DETACH 9
#define CGDEV_BPF_LINK_CREATE 28
#define CGDEV_BPF_CGROUP_DEVICE 6

struct cgdev_event {
    GD_EVENT_HEAD;
    u64 open_id;   /* write: the open's timestamp (the fd tracker's open_ns) */
    s32 fd;        /* write: the fd written; bpf: the target cgroup fd */
    u32 which;     /* write: FDT_KIND_CG_ALLOW / FDT_KIND_CG_DENY */
    u32 len;       /* write: bytes asked to write (text holds up to CGDEV_TEXT_LEN) */
    s32 bpf_cmd;
    u32 attach_type;
    u32 flags;
    u32 pad;
    char text[CGDEV_TEXT_LEN];
};

BPF_RINGBUF_OUTPUT(cgdev_events, 16);
/* thread -> the event of its write() or bpf() in progress, all but the head's result and
 * who (ts and kind are set at entry) */
BPF_HASH(cgdev_pending, u64, struct cgdev_event, 1024);

static __always_inline int cgdev_may_hold(struct fdt_proc *p)
{
    return p && (p->kinds[FDT_KIND_CG_ALLOW] || p->kinds[FDT_KIND_CG_DENY]);
}

/* At a syscall's exit: the thread's pending event, completed with who and the result. */
static __always_inline int cgdev_finish(struct gd_sys_exit *args)
{
    u64 id = bpf_get_current_pid_tgid();
    struct cgdev_event *p = cgdev_pending.lookup(&id);
    if (!p)
        return 0;
    struct cgdev_event *e = cgdev_events.ringbuf_reserve(sizeof(struct cgdev_event));
    if (e) {
        __builtin_memcpy(e, p, sizeof(*e));
        GD_HEAD(e, p->kind, p->ts, args->ret);
        cgdev_events.ringbuf_submit(e, 0);
    }
    cgdev_pending.delete(&id);
    return 0;
}

int cgdev_enter_write(struct gd_sys_enter *args)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    if (!cgdev_may_hold(fdt_proc_of(tgid)))
        return 0;
    struct fdt_val *v = fdt_lookup(tgid, (s32)args->args[0]);
    if (!v || (v->kind != FDT_KIND_CG_ALLOW && v->kind != FDT_KIND_CG_DENY))
        return 0;
    struct cgdev_event w = {};
    w.ts = bpf_ktime_get_ns();
    w.kind = CGDEV_EV_WRITE;
    w.open_id = v->open_ns;
    w.fd = (s32)args->args[0];
    w.which = v->kind;
    w.len = (u32)args->args[2];
    u64 n = w.len < CGDEV_TEXT_LEN - 1 ? w.len : CGDEV_TEXT_LEN - 1;
    asm volatile("" : "+r"(n));   /* keep the mask below: the verifier needs to see the bound */
    n &= CGDEV_TEXT_LEN - 1;
    bpf_probe_read_user(w.text, n, (const void *)args->args[1]);
    cgdev_pending.update(&id, &w);
    return 0;
}

int cgdev_exit_write(struct gd_sys_exit *args)
{
    if (!cgdev_may_hold(fdt_proc_of(bpf_get_current_pid_tgid() >> 32)))
        return 0;
    return cgdev_finish(args);
}

/* ---- cgroup v2: bpf() attaching device programs --------------------------------------------- */

int cgdev_enter_bpf(struct gd_sys_enter *args)
{
    int cmd = (int)args->args[0];
    if (cmd != CGDEV_BPF_PROG_ATTACH && cmd != CGDEV_BPF_PROG_DETACH &&
        cmd != CGDEV_BPF_LINK_CREATE)
        return 0;
    u64 id = bpf_get_current_pid_tgid();
    if ((id >> 32) == FDT_SELF_TGID)
        return 0;
    /* union bpf_attr is uapi (user memory, stable layout):
     *   PROG_ATTACH/DETACH: u32 target_fd, attach_bpf_fd, attach_type, attach_flags
     *   LINK_CREATE:        u32 prog_fd, target_fd, attach_type, flags                */
    u32 attr[4] = {};
    if (bpf_probe_read_user(attr, sizeof(attr), (const void *)args->args[1]) != 0)
        return 0;
    if (attr[2] != CGDEV_BPF_CGROUP_DEVICE)
        return 0;
    struct cgdev_event b = {};
    b.ts = bpf_ktime_get_ns();
    b.kind = CGDEV_EV_BPF;
    b.fd = cmd == CGDEV_BPF_LINK_CREATE ? (s32)attr[1] : (s32)attr[0];
    b.bpf_cmd = cmd;
    b.attach_type = attr[2];
    b.flags = attr[3];
    cgdev_pending.update(&id, &b);
    return 0;
}

int cgdev_exit_bpf(struct gd_sys_exit *args)
{
    return cgdev_finish(args);
}
