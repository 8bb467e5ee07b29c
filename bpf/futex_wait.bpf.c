/*
 * futex_wait: long futex waits of chosen processes (all their threads).
 *
 * Why: a thread hung inside a library (NVML init in seed 000) usually sits in futex(FUTEX_WAIT)
 * or in an ioctl; the futex wait of the very thread that entered nvmlInit_v2 is the proof that
 * it is blocked, not busy. Filtering happens in the kernel (a hash of target tgids filled by the
 * loader), and the user stack is captured only for waits longer than the threshold, when they
 * return; waits still in progress stay in futex_start for the loader to read at the end.
 * Only syscall tracepoint arguments and BPF helpers are read (no kernel structs).
 *
 * Options (-D cflags):
 *   FUTEX_MIN_NS      report waits at least this long (default 500 ms)
 *
 * Maps: futex_targets (tgid -> 1, filled by the loader), futex_start (thread -> wait in
 * progress), futex_events (ring buffer of finished long waits), futex_stacks (user stacks).
 */
#ifndef FUTEX_MIN_NS
#define FUTEX_MIN_NS 500000000ULL
#endif

#define FUTEX_CMD_MASK 0x7f   /* strips FUTEX_PRIVATE_FLAG (128) and FUTEX_CLOCK_REALTIME (256) */
#define FUTEX_WAIT_ 0
#define FUTEX_LOCK_PI_ 6
#define FUTEX_WAIT_BITSET_ 9
#define FUTEX_WAIT_REQUEUE_PI_ 11
#define FUTEX_LOCK_PI2_ 13

#include "include/syscall_tp.h"
#include "include/event.h"

struct futex_wait_start {
    u64 ts;
    u64 uaddr;
    u32 op;
    u32 pad;
};

#define FUTEX_EV_LONG_WAIT 1

struct futex_event {
    GD_EVENT_HEAD;
    u64 wait_ns;
    u64 uaddr;
    u32 op;
    u32 pad;
    s64 stack_id;
};

BPF_HASH(futex_targets, u32, u8, 1024);
BPF_HASH(futex_start, u64, struct futex_wait_start, 16384);
BPF_RINGBUF_OUTPUT(futex_events, 8);
BPF_STACK_TRACE(futex_stacks, 1024);

int futex_enter(struct gd_sys_enter *args)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    if (!futex_targets.lookup(&tgid))
        return 0;
    u32 cmd = (u32)args->args[1] & FUTEX_CMD_MASK;
    if (cmd != FUTEX_WAIT_ && cmd != FUTEX_WAIT_BITSET_ && cmd != FUTEX_LOCK_PI_ &&
        cmd != FUTEX_WAIT_REQUEUE_PI_ && cmd != FUTEX_LOCK_PI2_)
        return 0;
    struct futex_wait_start s = {.ts = bpf_ktime_get_ns(), .uaddr = (u64)args->args[0],
                                 .op = (u32)args->args[1]};
    futex_start.update(&id, &s);
    return 0;
}

int futex_exit(struct gd_sys_exit *args)
{
    u64 id = bpf_get_current_pid_tgid();
    struct futex_wait_start *s = futex_start.lookup(&id);
    if (!s)
        return 0;
    u64 wait = bpf_ktime_get_ns() - s->ts;
    if (wait >= FUTEX_MIN_NS) {
        struct futex_event *e = futex_events.ringbuf_reserve(sizeof(struct futex_event));
        if (e) {
            GD_HEAD(e, FUTEX_EV_LONG_WAIT, s->ts, args->ret);
            e->wait_ns = wait;
            e->uaddr = s->uaddr;
            e->op = s->op;
            e->pad = 0;
            /* Still in the syscall: the user stack is the one the wait started from. */
            e->stack_id = futex_stacks.get_stackid(args, BPF_F_USER_STACK);
            futex_events.ringbuf_submit(e, 0);
        }
    }
    futex_start.delete(&id);
    return 0;
}
