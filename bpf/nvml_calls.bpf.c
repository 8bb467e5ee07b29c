/*
 * nvml_calls: entry and return of NVML's init functions in chosen processes (uprobe pairs).
 *
 * Why: in seed 000 the device plugin calls nvmlInit on every GetPreferredAllocation and, on
 * some driver versions, never returns; kubelet waits forever behind it. "Entered and not
 * returned, for N seconds" is the direct evidence. The loader attaches these programs by path
 * to the library the target process really maps (through /proc/PID/root, so a library that
 * exists only inside a container works) and only for the target pids.
 *
 * Maps: nvml_entered (thread -> call in progress), nvml_events (ring buffer: enter / return).
 */
#include <uapi/linux/ptrace.h>
#include "include/ucall.h"

#define NVML_EV_ENTER 1
#define NVML_EV_RETURN 2
#define NVML_MAX_FUNCS 4

/* nested init calls (nvmlInit_v2 may call its siblings): the outermost counts */
BPF_HASH(nvml_entered, u64, struct gd_ucall, 4096);
BPF_RINGBUF_OUTPUT(nvml_events, 8);   /* struct gd_ucall_event */

static __always_inline int nvml_enter(u32 func)
{
    u64 id = bpf_get_current_pid_tgid();
    struct gd_ucall c;
    if (!gd_ucall_enter(nvml_entered.lookup(&id), &c, func))
        return 0;
    nvml_entered.update(&id, &c);
    struct gd_ucall_event *e = nvml_events.ringbuf_reserve(sizeof(*e));
    if (e) {
        gd_ucall_fill(e, NVML_EV_ENTER, &c, 0, c.ts);
        nvml_events.ringbuf_submit(e, 0);
    }
    return 0;
}

static __always_inline int nvml_return(struct pt_regs *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    struct gd_ucall *c = nvml_entered.lookup(&id);
    if (!c || !gd_ucall_returns(c))
        return 0;
    struct gd_ucall_event *e = nvml_events.ringbuf_reserve(sizeof(*e));
    if (e) {   /* ret: the nvmlReturn_t */
        gd_ucall_fill(e, NVML_EV_RETURN, c, (s32)PT_REGS_RC(ctx), bpf_ktime_get_ns());
        nvml_events.ringbuf_submit(e, 0);
    }
    nvml_entered.delete(&id);
    return 0;
}

int nvml_return_any(struct pt_regs *ctx) { return nvml_return(ctx); }

/* One entry program per probed function (the loader's FUNCS order): uprobes carry no cookie
 * in BCC, so the function is known by which program fired. */
#define NVML_ENTRY(n) \
    int nvml_enter_##n(struct pt_regs *ctx) { return nvml_enter(n); }
NVML_ENTRY(0) NVML_ENTRY(1) NVML_ENTRY(2) NVML_ENTRY(3)
