/*
 * event.h: the first fields of every ring-buffer event, and the one helper that fills them.
 *
 * Why: each program reports who did something (process, thread, command name, cgroup), when it
 * began, what kind of record it is and the result; written once here, read once by the loaders
 * (bundle.head). Program-specific fields follow the head in each event struct.
 */
#ifndef GD_EVENT_H
#define GD_EVENT_H

/* The head's fields, flat at the start of each event struct (BCC's ring-buffer decoder does not
 * follow named nested structs). */
#define GD_EVENT_HEAD                                                                         \
    u64 ts;          /* when what it reports began (the program's clock) */                \
    u64 cgroup_id;   /* bpf_get_current_cgroup_id(): the cgroup v2 id */                   \
    u32 kind;        /* the program's event kind */                                        \
    u32 pid;         /* tgid */                                                            \
    u32 tid;                                                                               \
    s32 ret;         /* the syscall's or call's result */                                  \
    char comm[16]

/* Fill the head of event `e` (any struct starting with GD_EVENT_HEAD). */
#define GD_HEAD(e, kind_, ts_, ret_)                                                          \
    do {                                                                                   \
        u64 gd_id_ = bpf_get_current_pid_tgid();                                           \
        (e)->ts = (ts_);                                                                   \
        (e)->cgroup_id = bpf_get_current_cgroup_id();                                      \
        (e)->kind = (kind_);                                                               \
        (e)->pid = gd_id_ >> 32;                                                           \
        (e)->tid = (u32)gd_id_;                                                            \
        (e)->ret = (s32)(ret_);                                                            \
        bpf_get_current_comm((e)->comm, sizeof((e)->comm));                                \
    } while (0)

#endif /* GD_EVENT_H */
