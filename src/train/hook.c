/* hook.c — [checkpoint] hook: starts a detached shell command after each checkpoint (posix_spawn, own session). */
#define _GNU_SOURCE /* POSIX_SPAWN_SETSID */
#include "train/hook.h"
#include "core/check.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

extern char **environ;

struct checkpoint_hook {
    char command[DECK_PATH_MAX];
    char run_dir[DECK_PATH_MAX];
    char log_path[DECK_PATH_MAX + 16];
    pid_t pid;                 /* the last command started, 0 when none runs */
    int64_t step;              /* the step it was started for */
};

checkpoint_hook *hook_create(const deck *config)
{
    if (!config->checkpoint.hook[0]) return NULL;
    checkpoint_hook *h = xcalloc(1, sizeof *h);
    snprintf(h->command, sizeof h->command, "%s", config->checkpoint.hook);
    snprintf(h->run_dir, sizeof h->run_dir, "%s", config->run.dir);
    snprintf(h->log_path, sizeof h->log_path, "%s/hooks.log", config->run.dir);
    return h;
}

/* 1 while the last command runs; else 0, after a warning when it failed. */
static int still_running(checkpoint_hook *h)
{
    if (h->pid <= 0) return 0;
    int status = 0;
    pid_t done = waitpid(h->pid, &status, WNOHANG);
    if (done == 0) return 1;
    if (done == h->pid && WIFEXITED(status) && WEXITSTATUS(status) != 0)
        aldit_warn("the checkpoint hook of step %" PRId64 " exited with status %d (its output: %s)", h->step,
                   WEXITSTATUS(status), h->log_path);
    else if (done == h->pid && WIFSIGNALED(status))
        aldit_warn("the checkpoint hook of step %" PRId64 " was ended by signal %d (its output: %s)", h->step,
                   WTERMSIG(status), h->log_path);
    h->pid = 0;
    return 0;
}

static char *copy_string(const char *text)
{
    char *copy = xmalloc(strlen(text) + 1);
    memcpy(copy, text, strlen(text) + 1);
    return copy;
}

/* environ and the three ALDIT_ variables (which replace any of the same name); free with free_environment. */
static char **hook_environment(const checkpoint_hook *h, const char *path, int64_t step)
{
    size_t n = 0;
    while (environ[n]) n++;
    char **env = xcalloc(n + 4, sizeof *env);
    size_t used = 0;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "ALDIT_CHECKPOINT=", 17) && strncmp(environ[i], "ALDIT_STEP=", 11) &&
            strncmp(environ[i], "ALDIT_RUN_DIR=", 14))
            env[used++] = copy_string(environ[i]);
    const char *names[] = {"ALDIT_CHECKPOINT", "ALDIT_STEP", "ALDIT_RUN_DIR"};
    char step_text[32];
    snprintf(step_text, sizeof step_text, "%" PRId64, step);
    const char *values[] = {path, step_text, h->run_dir};
    for (int v = 0; v < 3; v++) {
        size_t size = strlen(names[v]) + strlen(values[v]) + 2;
        env[used] = xmalloc(size);
        snprintf(env[used++], size, "%s=%s", names[v], values[v]);
    }
    return env;
}

static void free_environment(char **env)
{
    for (size_t i = 0; env[i]; i++) free(env[i]);
    free(env);
}

/* posix_spawn of /bin/sh -c COMMAND, detached; 0 or an errno. */
static int spawn(checkpoint_hook *h, const char *path, int64_t step)
{
    FILE *log = fopen(h->log_path, "a"); /* the header line, before the command's own output */
    if (log) {
        fprintf(log, "== aldit: checkpoint hook for step %" PRId64 " (%s): %s\n", step, path, h->command);
        fclose(log);
    }
    posix_spawn_file_actions_t files;
    posix_spawnattr_t attributes;
    posix_spawn_file_actions_init(&files);
    posix_spawn_file_actions_addopen(&files, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&files, 1, h->log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_adddup2(&files, 1, 2);
    posix_spawnattr_init(&attributes);
    posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSID);
    char *argv[] = {"sh", "-c", h->command, NULL};
    char **env = hook_environment(h, path, step);
    int error = posix_spawn(&h->pid, "/bin/sh", &files, &attributes, argv, env);
    free_environment(env);
    posix_spawnattr_destroy(&attributes);
    posix_spawn_file_actions_destroy(&files);
    if (error != 0) h->pid = 0;
    else h->step = step;
    return error;
}

void hook_after_checkpoint(checkpoint_hook *h, const char *path, int64_t step)
{
    if (!h) return;
    if (still_running(h)) {
        printf("aldit: note: the checkpoint hook of step %" PRId64 " is still running; none is started for step %"
               PRId64 "\n", h->step, step);
        fflush(stdout);
        return;
    }
    int error = spawn(h, path, step);
    if (error != 0)
        aldit_warn("cannot start the checkpoint hook for step %" PRId64 ": %s (training goes on)", step,
                   strerror(error));
}

void hook_close(checkpoint_hook *h)
{
    if (!h) return;
    if (still_running(h))
        printf("aldit: note: the checkpoint hook of step %" PRId64 " is still running (pid %ld); it goes on after "
               "aldit exits (its output: %s)\n", h->step, (long)h->pid, h->log_path);
    free(h);
}
