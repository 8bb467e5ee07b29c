/*
 * ucall.h: a library call in progress per thread, between an entry and a return uprobe.
 *
 * Why one: nvml_calls and cuda_calls track calls the same way (the outermost call of a thread
 * counts, nested calls of probed siblings only bump a depth, a call that never returns stays in
 * the program's map for the loader to read) and report them with the same event. The map
 * calls stay in each program (BCC rewrites `m.lookup()` only outside macros, and a map cannot
 * be passed to a function), so these helpers work on what the program looked up.
 * The loaders read these fields by name (tracing/ucalls.py).
 */
#ifndef GD_UCALL_H
#define GD_UCALL_H

#include "event.h"

struct gd_ucall {
    u64 ts;       /* when the outermost call was entered */
    u32 func;     /* the loader's index of the probed function */
    u32 depth;    /* nested probed calls under it */
};

struct gd_ucall_event {
    GD_EVENT_HEAD;   /* ret: the call's result (return events) */
    u64 duration_ns;
    u32 func;
    u32 pad;
};

/* At a probed function's entry, given the thread's call in progress (`outer`, NULL if none):
 * 1 when this call is the outermost one and `c` is filled, to be stored by the caller;
 * 0 when it is nested in another (counted in the outer call's depth). */
static __always_inline int gd_ucall_enter(struct gd_ucall *outer, struct gd_ucall *c, u32 func)
{
    if (outer) {
        outer->depth++;
        return 0;
    }
    c->ts = bpf_ktime_get_ns();
    c->func = func;
    c->depth = 0;
    return 1;
}

/* At a return, given the thread's call in progress (NULL if none was seen): 1 when the
 * outermost call returns (the caller reports it and deletes it), 0 otherwise. */
static __always_inline int gd_ucall_returns(struct gd_ucall *c)
{
    if (!c)
        return 0;
    if (c->depth > 0) {
        c->depth--;
        return 0;
    }
    return 1;
}

/* Fill a reserved event about call `c`; `now` is the return time (c->ts at entry). */
static __always_inline void gd_ucall_fill(struct gd_ucall_event *e, u32 kind, struct gd_ucall *c,
                                          s32 ret, u64 now)
{
    GD_HEAD(e, kind, c->ts, ret);
    e->duration_ns = now - c->ts;
    e->func = c->func;
    e->pad = 0;
}

#endif /* GD_UCALL_H */
