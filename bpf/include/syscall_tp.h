/*
 * syscall_tp.h: the record a syscall tracepoint hands its BPF program, written once.
 *
 * Why: tracefs describes it (events/syscalls/<name>/format) as an 8-byte common header, the
 * syscall number, then the six arguments (sys_enter_*) or the return value (sys_exit_*), each
 * 8 bytes. That is a fixed ABI of kernel/trace/trace_syscalls.c, not a kernel struct from
 * headers (which may not match the running kernel); bundle.syscall_layout_ok checks the offsets
 * against tracefs before anything is attached. Declared here rather than through BCC's
 * generated tracepoint structs so all programs can share one compile.
 */
#ifndef GD_SYSCALL_TP_H
#define GD_SYSCALL_TP_H

struct gd_sys_enter {
    u64 common;
    s32 nr;
    u32 pad;
    u64 args[6];
};

struct gd_sys_exit {
    u64 common;
    s32 nr;
    u32 pad;
    s64 ret;
};

#endif /* GD_SYSCALL_TP_H */
