/*
 * cuda_calls: CUDA driver-API calls (libcuda.so.1) that return an error, per process.
 *
 * Why: "CUDA error 999" in a pod's log says nothing about its cause; the cause is usually in
 * the kernel at the same moment (an EPERM on /dev/nvidia-uvm from the device cgroup, an Xid).
 * The loader attaches these programs (entry + return uprobe pairs) to every distinct
 * libcuda.so.1 inode that GPU containers map or would load (through /proc/PID/root), for all
 * processes: the NVIDIA container toolkit bind-mounts the host's library, so one attachment
 * covers the containers started during the window too. Only init, device, context and memory
 * calls are probed (never kernel launches); a call counts once at its outermost level.
 *
 * Maps read by the loader:
 *   cuda_events    ring buffer of struct gd_ucall_event (calls that returned non-zero)
 *   cuda_entered   thread -> call in progress (cuInit that never returns is seen here)
 *   cuda_counts    (tgid, function) -> calls, failures
 */
#include <uapi/linux/ptrace.h>
#include "include/ucall.h"

#define CUDA_MAX_FUNCS 16
#define CUDA_EV_FAILED 1

struct cuda_countkey {
    u32 tgid;
    u32 func;
};

struct cuda_count {
    u64 calls;
    u64 failed;
};

BPF_HASH(cuda_entered, u64, struct gd_ucall, 16384);
BPF_HASH(cuda_counts, struct cuda_countkey, struct cuda_count, 4096);
BPF_RINGBUF_OUTPUT(cuda_events, 8);

static __always_inline int cuda_enter(u32 func)
{
    u64 id = bpf_get_current_pid_tgid();
    struct gd_ucall c;
    if (gd_ucall_enter(cuda_entered.lookup(&id), &c, func))
        cuda_entered.update(&id, &c);
    return 0;
}

int cuda_return(struct pt_regs *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    struct gd_ucall *c = cuda_entered.lookup(&id);
    if (!c || !gd_ucall_returns(c))
        return 0;
    s32 ret = (s32)PT_REGS_RC(ctx);
    struct cuda_countkey k = {.tgid = id >> 32, .func = c->func};
    struct cuda_count *n = cuda_counts.lookup(&k);
    if (!n) {
        struct cuda_count zero = {};
        cuda_counts.update(&k, &zero);
        n = cuda_counts.lookup(&k);
    }
    if (n) {
        __sync_fetch_and_add(&n->calls, 1);
        if (ret != 0)
            __sync_fetch_and_add(&n->failed, 1);
    }
    if (ret != 0) {
        struct gd_ucall_event *e = cuda_events.ringbuf_reserve(sizeof(*e));
        if (e) {
            gd_ucall_fill(e, CUDA_EV_FAILED, c, ret, bpf_ktime_get_ns());
            cuda_events.ringbuf_submit(e, 0);
        }
    }
    cuda_entered.delete(&id);
    return 0;
}

/* One entry program per probed function (the loader's FUNCS order): uprobes carry no cookie
 * in BCC, so the function is known by which program fired. */
#define CUDA_ENTRY(n) \
    int cuda_enter_##n(struct pt_regs *ctx) { return cuda_enter(n); }
CUDA_ENTRY(0) CUDA_ENTRY(1) CUDA_ENTRY(2) CUDA_ENTRY(3)
CUDA_ENTRY(4) CUDA_ENTRY(5) CUDA_ENTRY(6) CUDA_ENTRY(7)
CUDA_ENTRY(8) CUDA_ENTRY(9) CUDA_ENTRY(10) CUDA_ENTRY(11)
CUDA_ENTRY(12) CUDA_ENTRY(13) CUDA_ENTRY(14) CUDA_ENTRY(15)
