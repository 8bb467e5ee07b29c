/* Holds a file open, then stays in a real uninterruptible sleep (D) or a plain sleep (S).
 *
 * Used by tests/hang/test_dstate.py to put a real process in D state without a hung mount:
 * the parent of vfork() waits in the kernel for its child to exec or exit
 * (kernel/fork.c wait_for_vfork_done, TASK_KILLABLE, which /proc reports as "D"); the child
 * sleeps in pause() and never does. "d" mode: that; "s" mode: pause() in the holder itself.
 * The test ends it by killing the child (the parent then returns and exits) or the holder.
 */
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 3)
        return 2;
    int fd = open(argv[1], O_RDONLY);
    if (fd < 0)
        return 3;
    if (!strcmp(argv[2], "s")) {
        pause();
        return 0;
    }
    pid_t child = vfork();
    if (child == 0) {
        pause();
        _exit(0);
    }
    waitpid(child, NULL, 0);
    return 0;
}
