/* hook.c — [checkpoint] on_save: the command started after each checkpoint with posix_spawn, detached, at most one at a time. */
#define _GNU_SOURCE
#include "train/hook.h"

#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/check.h"

extern char **environ;

struct checkpoint_hook {
    char *command;
    char log[4096];
    char run_dir[4096];
    pid_t running;          /* the command started last, 0 when none is (or its end was reported) */
    int64_t running_step;
};

checkpoint_hook *hook_create(const char *command, const char *run_dir)
{
    if (!command || !command[0]) return NULL;
    checkpoint_hook *hook = xcalloc(1, sizeof *hook);
    hook->command = xmalloc(strlen(command) + 1);
    strcpy(hook->command, command);
    snprintf(hook->run_dir, sizeof hook->run_dir, "%s", run_dir);
    snprintf(hook->log, sizeof hook->log, "%s/on_save.log", run_dir);
    return hook;
}

/* 1 while the last command runs; otherwise 0, after saying how it ended (once). */
static int still_running(checkpoint_hook *hook)
{
    if (hook->running == 0) return 0;
    int status = 0;
    const pid_t done = waitpid(hook->running, &status, WNOHANG);
    if (done == 0) return 1;
    if (done == hook->running && WIFEXITED(status) && WEXITSTATUS(status) != 0)
        aldit_warn("[checkpoint] on_save for step %lld exited with status %d (its output: %s)",
                   (long long)hook->running_step, WEXITSTATUS(status), hook->log);
    else if (done == hook->running && WIFSIGNALED(status))
        aldit_warn("[checkpoint] on_save for step %lld was ended by signal %d (its output: %s)",
                   (long long)hook->running_step, WTERMSIG(status), hook->log);
    hook->running = 0;
    return 0;
}

/* environ with the three ALDIT_ variables put first (the caller frees the array and its first three strings). */
static char **hook_environment(const checkpoint_hook *hook, const char *path, int64_t step)
{
    size_t n = 0;
    while (environ[n]) n++;
    char **env = xcalloc(n + 4, sizeof *env);
    const char *names[3] = {"ALDIT_CHECKPOINT", "ALDIT_STEP", "ALDIT_RUN_DIR"};
    char step_text[32];
    snprintf(step_text, sizeof step_text, "%lld", (long long)step);
    const char *values[3] = {path, step_text, hook->run_dir};
    for (int i = 0; i < 3; i++) {
        env[i] = xmalloc(strlen(names[i]) + strlen(values[i]) + 2);
        sprintf(env[i], "%s=%s", names[i], values[i]);
    }
    size_t at = 3;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "ALDIT_CHECKPOINT=", 17) != 0 && strncmp(environ[i], "ALDIT_STEP=", 11) != 0 &&
            strncmp(environ[i], "ALDIT_RUN_DIR=", 14) != 0)
            env[at++] = environ[i];
    return env;
}

void hook_after_checkpoint(checkpoint_hook *hook, const char *path, int64_t step)
{
    if (!hook) return;
    if (still_running(hook)) {
        printf("aldit: note: [checkpoint] on_save for step %lld (pid %ld) is still running: not started for step "
               "%lld\n", (long long)hook->running_step, (long)hook->running, (long long)step);
        fflush(stdout);
        return;
    }
    posix_spawn_file_actions_t files;
    posix_spawnattr_t attributes;
    posix_spawn_file_actions_init(&files);
    posix_spawn_file_actions_addopen(&files, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&files, STDOUT_FILENO, hook->log, O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW,
                                     0644);
    posix_spawn_file_actions_adddup2(&files, STDOUT_FILENO, STDERR_FILENO);
    posix_spawnattr_init(&attributes);
    posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSID);
    char **env = hook_environment(hook, path, step);
    char *argv[] = {"/bin/sh", "-c", hook->command, NULL};
    pid_t pid = 0;
    fflush(stdout);
    fflush(stderr);
    const int error = posix_spawn(&pid, "/bin/sh", &files, &attributes, argv, env);
    for (int i = 0; i < 3; i++) free(env[i]);
    free(env);
    posix_spawnattr_destroy(&attributes);
    posix_spawn_file_actions_destroy(&files);
    if (error != 0) {
        aldit_warn("[checkpoint] on_save could not be started for step %lld: %s", (long long)step, strerror(error));
        return;
    }
    hook->running = pid;
    hook->running_step = step;
}

void hook_free(checkpoint_hook *hook)
{
    if (!hook) return;
    if (still_running(hook))
        printf("aldit: note: [checkpoint] on_save for step %lld (pid %ld) is still running; it goes on after aldit "
               "exits (its output: %s)\n", (long long)hook->running_step, (long)hook->running, hook->log);
    free(hook->command);
    free(hook);
}
