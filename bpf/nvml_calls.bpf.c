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

#define NVML_EV_ENTER 1
#define NVML_EV_RETURN 2
#define NVML_FN_INIT_V2 1
#define NVML_FN_INIT 2
#define NVML_FN_INIT_WITH_FLAGS 3

struct nvml_call {
    u64 ts;
    u32 func;
    u32 depth;   /* nested init calls (nvmlInit_v2 may call its siblings): outermost counts */
};

struct nvml_event {
    u64 ts;
    u64 duration_ns;
    u32 kind;
    u32 func;
    u32 pid;
    u32 tid;
    s64 ret;
    char comm[16];
};

BPF_HASH(nvml_entered, u64, struct nvml_call, 4096);
BPF_RINGBUF_OUTPUT(nvml_events, 8);

static __always_inline int nvml_enter(u32 func)
{
    u64 id = bpf_get_current_pid_tgid();
    struct nvml_call *outer = nvml_entered.lookup(&id);
    if (outer) {
        outer->depth++;
        return 0;
    }
    struct nvml_call c = {.ts = bpf_ktime_get_ns(), .func = func};
    nvml_entered.update(&id, &c);
    struct nvml_event *e = nvml_events.ringbuf_reserve(sizeof(struct nvml_event));
    if (e) {
        e->ts = c.ts;
        e->duration_ns = 0;
        e->kind = NVML_EV_ENTER;
        e->func = func;
        e->pid = id >> 32;
        e->tid = (u32)id;
        e->ret = 0;
        bpf_get_current_comm(e->comm, sizeof(e->comm));
        nvml_events.ringbuf_submit(e, 0);
    }
    return 0;
}

static __always_inline int nvml_return(struct pt_regs *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    struct nvml_call *c = nvml_entered.lookup(&id);
    if (!c)
        return 0;
    if (c->depth > 0) {
        c->depth--;
        return 0;
    }
    u64 now = bpf_ktime_get_ns();
    struct nvml_event *e = nvml_events.ringbuf_reserve(sizeof(struct nvml_event));
    if (e) {
        e->ts = c->ts;
        e->duration_ns = now - c->ts;
        e->kind = NVML_EV_RETURN;
        e->func = c->func;
        e->pid = id >> 32;
        e->tid = (u32)id;
        e->ret = (s64)(int)PT_REGS_RC(ctx);   /* nvmlReturn_t */
        bpf_get_current_comm(e->comm, sizeof(e->comm));
        nvml_events.ringbuf_submit(e, 0);
    }
    nvml_entered.delete(&id);
    return 0;
}

int nvml_enter_init_v2(struct pt_regs *ctx) { return nvml_enter(NVML_FN_INIT_V2); }
int nvml_enter_init(struct pt_regs *ctx) { return nvml_enter(NVML_FN_INIT); }
int nvml_enter_init_with_flags(struct pt_regs *ctx) { return nvml_enter(NVML_FN_INIT_WITH_FLAGS); }
int nvml_return_any(struct pt_regs *ctx) { return nvml_return(ctx); }
