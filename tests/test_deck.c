/* test_deck.c — cmocka tests of the input deck (values, every error kind with its line, overrides,
   printing that re-parses, the shipped decks and docs) and of the command line. */
#include "deck/cli.h"
#include "deck/deck.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

/* Errors and messages of one deck_load. */
typedef struct {
    deck config;
    int n_errors;
    char *messages;
    char path[256]; /* the temporary deck, when one was written */
} load_result;

static const char *top_srcdir(void)
{
    const char *dir = getenv("top_srcdir");
    return dir && dir[0] ? dir : ALDIT_TOP_SRCDIR;
}

static void source_path(char *path, size_t size, const char *relative)
{
    snprintf(path, size, "%s/%s", top_srcdir(), relative);
}

static void load_path(load_result *result, const char *path, int n_overrides, char *const overrides[])
{
    size_t size = 0;
    FILE *errors = open_memstream(&result->messages, &size);
    assert_non_null(errors);
    deck_defaults(&result->config);
    result->n_errors = deck_load(&result->config, path, n_overrides, overrides, errors);
    fclose(errors);
}

/* Write `text` to a temporary deck and load it. */
static void load_text(load_result *result, const char *text, int n_overrides, char *const overrides[])
{
    snprintf(result->path, sizeof result->path, "/tmp/test_deck_XXXXXX");
    int fd = mkstemp(result->path);
    assert_true(fd >= 0);
    FILE *file = fdopen(fd, "w");
    assert_non_null(file);
    fputs(text, file);
    fclose(file);
    load_path(result, result->path, n_overrides, overrides);
}

static void load_source(load_result *result, const char *relative, int n_overrides, char *const overrides[])
{
    source_path(result->path, sizeof result->path, relative);
    load_path(result, result->path, n_overrides, overrides);
    result->path[0] = '\0'; /* not a temporary: keep it */
}

static void load_free(load_result *result)
{
    free(result->messages);
    if (result->path[0]) unlink(result->path);
}

/* The messages hold "PREFIX..." where PREFIX is "FILE:LINE: " and then `fragment` on the same line. */
static void assert_message(const load_result *result, const char *file, int line, const char *fragment)
{
    char prefix[512];
    if (line > 0) snprintf(prefix, sizeof prefix, "%s:%d: ", file, line);
    else snprintf(prefix, sizeof prefix, "%s: ", file);
    for (const char *at = result->messages; (at = strstr(at, prefix)) != NULL; at++) {
        if (at != result->messages && at[-1] != '\n') continue;
        const char *end = strchr(at, '\n');
        size_t length = end ? (size_t)(end - at) : strlen(at);
        char message[1024];
        snprintf(message, sizeof message, "%.*s", (int)length, at);
        if (strstr(message, fragment)) return;
    }
    fail_msg("no message '%s...%s' in:\n%s", prefix, fragment, result->messages);
}

static int count_lines(const char *text)
{
    int lines = 0;
    for (; *text; text++) lines += *text == '\n';
    return lines;
}

/* ---- values ---------------------------------------------------------------------------------------- */

static void test_defaults(void **state)
{
    (void)state;
    deck config;
    deck_defaults(&config);
    assert_string_equal(config.run.dir, "run");
    assert_int_equal(config.run.device, DEVICE_AUTO);
    assert_int_equal(config.run.seed, 1234);
    assert_int_equal(config.run.steps, 0);
    assert_int_equal(config.run.epochs, 1);
    assert_int_equal(config.model.dim, 1536);
    assert_int_equal(config.model.ffn_dim, 8960);
    assert_int_equal(config.model.num_heads, 12);
    assert_int_equal(config.model.num_layers, 30);
    assert_int_equal(config.model.in_dim, 16);
    assert_int_equal(config.model.patch_t, 1);
    assert_int_equal(config.model.patch_h, 2);
    assert_int_equal(config.model.text_len, 512);
    assert_int_equal(config.model.text_dim, 4096);
    assert_int_equal(config.model.freq_dim, 256);
    assert_true(config.model.eps == 1e-6);
    assert_int_equal(config.model.qk_norm, 1);
    assert_int_equal(config.model.cross_attn_norm, 1);
    assert_true(config.model.init_std == 0.02);
    assert_string_equal(config.model.init, "");
    assert_int_equal(config.data.prefetch, 1);
    assert_int_equal(config.balance.strategy, STRATEGY_GLOBAL);
    assert_int_equal(config.balance.global_batch, 0);
    assert_int_equal(config.balance.max_tokens, 76032);
    assert_true(config.balance.mem_budget == 0);
    assert_true(config.balance.mem_margin == 0.1);
    assert_true(config.balance.device_mem == 80.0 * 1024 * 1024 * 1024);
    assert_true(config.balance.device_tflops == 600);
    assert_true(config.balance.attention_tflops == 500);
    assert_int_equal(config.balance.pool, 4096);
    assert_int_equal(config.balance.oversize, OVERSIZE_ERROR);
    assert_int_equal(config.balance.calibrate, 1);
    assert_int_equal(config.balance.calibrate_window, 50);
    assert_int_equal(config.balance.calibrate_packed, 1);
    assert_true(config.train.lr == 1e-4);
    assert_int_equal(config.train.warmup_steps, 100);
    assert_int_equal(config.train.lr_schedule, LR_COSINE);
    assert_true(config.train.weight_decay == 0.01);
    assert_true(config.train.beta1 == 0.9 && config.train.beta2 == 0.999 && config.train.adam_eps == 1e-8);
    assert_true(config.train.grad_clip == 1.0);
    assert_true(config.train.timestep_shift == 5.0);
    assert_int_equal(config.train.recompute, RECOMPUTE_NONE);
    assert_int_equal(config.train.nonfinite, NONFINITE_ERROR);
    assert_int_equal(config.train.attention, ATTENTION_AUTO);
    assert_int_equal(config.checkpoint.every, 0);
    assert_int_equal(config.checkpoint.keep, 3);
    assert_int_equal(config.checkpoint.resume, 1);
    assert_int_equal(config.log.every, 1);
    assert_string_equal(config.log.metrics, "metrics.jsonl");
    assert_string_equal(config.eval.store, "");
    assert_int_equal(config.eval.every, 100);
    assert_int_equal(config.eval.samples, 0);
    assert_int_equal(config.eval.sigmas.n, 9);
    for (int i = 0; i < 9; i++) assert_true(config.eval.sigmas.values[i] == (i + 1) / 10.0);
}

static void test_no_deck_is_defaults(void **state)
{
    (void)state;
    load_result result = {0};
    load_path(&result, NULL, 0, NULL);
    assert_int_equal(result.n_errors, 0);
    deck defaults;
    deck_defaults(&defaults);
    assert_memory_equal(&result.config, &defaults, sizeof defaults);
    load_free(&result);
}

static void test_good_deck(void **state)
{
    (void)state;
    load_result result = {0};
    load_source(&result, "tests/decks/good.ini", 0, NULL);
    assert_int_equal(result.n_errors, 0);
    const deck *c = &result.config;
    assert_string_equal(c->run.dir, "runs/good");
    assert_int_equal(c->run.device, DEVICE_CPU);
    assert_int_equal(c->run.seed, 42);
    assert_int_equal(c->run.steps, 250);
    assert_int_equal(c->run.epochs, 3);
    assert_int_equal(c->run.threads, 2);
    assert_string_equal(c->model.name, "tiny");
    assert_int_equal(c->model.dim, 96);
    assert_int_equal(c->model.num_heads, 6);
    assert_int_equal(c->model.freq_dim, 64);
    assert_true(c->model.eps == 1e-5);
    assert_int_equal(c->model.qk_norm, 0);
    assert_int_equal(c->model.cross_attn_norm, 1);
    assert_string_equal(c->model.init, "weights/start.h5");
    assert_string_equal(c->data.store, "data/tiny.h5");
    assert_int_equal(c->data.prefetch, 0);
    assert_int_equal(c->balance.strategy, STRATEGY_DUAL);
    assert_int_equal(c->balance.global_batch, 32);
    assert_int_equal(c->balance.max_tokens, 100000);
    assert_true(c->balance.compute_budget == 0.25);
    assert_true(c->balance.mem_budget == 12.0 * 1073741824.0);
    assert_true(c->balance.device_mem == 96.0 * 1073741824.0);
    assert_true(c->balance.device_tflops == 300.5);
    assert_true(c->balance.dual_p == 1.6);
    assert_int_equal(c->balance.oversize, OVERSIZE_SKIP);
    assert_int_equal(c->balance.calibrate, 0);
    assert_int_equal(c->balance.recompute, RECOMPUTE_BLOCK);
    assert_true(c->train.lr == 3e-4);
    assert_true(c->train.min_lr == 1e-5);
    assert_int_equal(c->train.lr_schedule, LR_CONSTANT);
    assert_true(c->train.beta2 == 0.95);
    assert_int_equal(c->train.nonfinite, NONFINITE_SKIP);
    assert_int_equal(c->train.attention, ATTENTION_OWN);
    assert_int_equal(c->checkpoint.every, 100);
    assert_int_equal(c->checkpoint.keep, 2);
    assert_int_equal(c->checkpoint.resume, 0);
    assert_int_equal(c->log.every, 5);
    assert_string_equal(c->log.metrics, "good.jsonl");
    char expected_source[512];
    source_path(expected_source, sizeof expected_source, "tests/decks/good.ini");
    assert_string_equal(c->source, expected_source);
    load_free(&result);
}

static void test_shipped_decks(void **state)
{
    (void)state;
    static const char *const decks[] = {"inputs/quickstart.ini", "inputs/wan1.3b.ini", "inputs/wan14b.ini"};
    load_result results[3];
    for (int i = 0; i < 3; i++) {
        results[i] = (load_result){0};
        load_source(&results[i], decks[i], 0, NULL);
        if (results[i].n_errors != 0) fail_msg("%s: %s", decks[i], results[i].messages);
    }
    const deck *quick = &results[0].config, *small = &results[1].config, *large = &results[2].config;
    assert_int_equal(quick->run.device, DEVICE_CPU);
    assert_int_equal(quick->model.dim, 64);
    assert_int_equal(quick->model.num_heads, 4);
    assert_int_equal(quick->model.text_len, 16);
    assert_int_equal(quick->model.text_dim, 32);
    assert_string_equal(quick->data.store, "quickstart.h5");
    assert_true(quick->run.steps > 0);
    assert_int_equal(small->model.dim, 1536);
    assert_int_equal(small->model.ffn_dim, 8960);
    assert_int_equal(small->model.num_heads, 12);
    assert_int_equal(small->model.num_layers, 30);
    assert_string_equal(small->model.init, ""); /* "init =  ; comment" is empty, not the comment */
    assert_int_equal(large->model.dim, 5120);
    assert_int_equal(large->model.ffn_dim, 13824);
    assert_int_equal(large->model.num_heads, 40);
    assert_int_equal(large->model.num_layers, 40);
    assert_int_equal(large->model.text_dim, 4096);
    assert_string_equal(large->data.store, "mixed.h5");
    for (int i = 0; i < 3; i++) load_free(&results[i]);
}

/* ---- errors ---------------------------------------------------------------------------------------- */

static void test_every_error_kind_with_its_line(void **state)
{
    (void)state;
    load_result result = {0};
    load_source(&result, "tests/decks/errors.ini", 0, NULL);
    char file[512];
    source_path(file, sizeof file, "tests/decks/errors.ini");
    assert_message(&result, file, 3, "run.steps: -5 is out of range [0,");
    assert_message(&result, file, 4, "run.seed: 'abc' is not an integer");
    assert_message(&result, file, 5, "run.device: 'tpu' is not one of: auto, cpu, cuda");
    assert_message(&result, file, 7, "unknown key 'dimm' in [model] (did you mean dim?)");
    assert_message(&result, file, 8, "model.qk_norm: 'maybe' is not a boolean");
    assert_message(&result, file, 9, "model.eps: '1e-6x' is not a finite number");
    assert_message(&result, file, 11, "duplicate key model.dim (first set on line 10)");
    assert_message(&result, file, 12, "unknown section [modle]");
    assert_message(&result, file, 15, "balance.mem_budget: 'lots' is not a byte size");
    assert_message(&result, file, 16, "balance.global_batch: 0 is out of range [1, 1000000000000] or budget");
    assert_message(&result, file, 17, "expected 'key = value', '[section]' or a comment");
    assert_message(&result, file, 18, "section header without ']'");
    /* every error once, nothing for the keys under the bad sections (lines 13 and 19), no cross checks */
    assert_int_equal(result.n_errors, 12);
    assert_int_equal(count_lines(result.messages), 12);
    load_free(&result);
}

static void test_syntax_errors_and_indented_keys(void **state)
{
    (void)state;
    load_result result = {0};
    load_source(&result, "tests/decks/syntax.ini", 0, NULL);
    char file[512];
    source_path(file, sizeof file, "tests/decks/syntax.ini");
    assert_message(&result, file, 2, "'name' is outside any [section]");
    assert_message(&result, file, 6, "line is longer than");
    assert_message(&result, file, 7, "missing key name before '='");
    assert_int_equal(result.n_errors, 3);
    /* an indented key is a key (not inih's continuation of the previous value); parsing went on */
    assert_int_equal(result.config.run.steps, 7);
    assert_string_equal(result.config.run.dir, "run");
    assert_int_equal(result.config.run.epochs, 2);
    load_free(&result);
}

/* A NUL byte would end the line's C string and drop the rest of it silently: an error naming FILE:LINE,
   and the lines after it still parse. */
static void test_nul_byte_in_a_line(void **state)
{
    (void)state;
    static const char text[] = "[run]\ndir = run\0/elsewhere\nepochs = 2\n";
    load_result result = {0};
    snprintf(result.path, sizeof result.path, "/tmp/test_deck_XXXXXX");
    int fd = mkstemp(result.path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, sizeof text - 1), (ssize_t)(sizeof text - 1));
    close(fd);
    load_path(&result, result.path, 0, NULL);
    assert_message(&result, result.path, 2, "NUL byte in the line");
    assert_int_equal(result.n_errors, 1);
    assert_int_equal(result.config.run.epochs, 2);
    load_free(&result);
}

static void test_missing_file(void **state)
{
    (void)state;
    load_result result = {0};
    load_path(&result, "/nonexistent/deck.ini", 0, NULL);
    assert_int_equal(result.n_errors, 1);
    assert_message(&result, "/nonexistent/deck.ini", 0, "cannot open the deck: No such file or directory");
    load_free(&result);
}

static void test_errors_collected_from_file_and_command_line(void **state)
{
    (void)state;
    char *overrides[] = {"model.dim=abc", "train.nope=1"};
    load_result result = {0};
    load_text(&result, "[run]\nsteps = x\n[model]\nnum_layers = 0\n", 2, overrides);
    assert_message(&result, result.path, 2, "run.steps: 'x' is not an integer");
    assert_message(&result, result.path, 4, "model.num_layers: 0 is out of range [1, 1024]");
    assert_message(&result, "command line", 0, "model.dim: 'abc' is not an integer");
    assert_message(&result, "command line", 0, "unknown key train.nope");
    assert_int_equal(result.n_errors, 4);
    load_free(&result);
}

static void test_many_errors_counted_first_hundred_printed(void **state)
{
    (void)state;
    char text[150 * 8 + 1] = "";
    for (int i = 0; i < 150; i++) strcat(text, "garbage\n");
    load_result result = {0};
    load_text(&result, text, 0, NULL);
    assert_int_equal(result.n_errors, 150);
    assert_int_equal(count_lines(result.messages), 101);
    assert_message(&result, result.path, 100, "expected 'key = value'");
    assert_message(&result, result.path, 0, "50 more errors not shown");
    load_free(&result);
}

static void test_unknown_key_suggestions(void **state)
{
    (void)state;
    load_result result = {0};
    load_text(&result, "[train]\nstrategy = dual\nlearning_rate = 1\n[model]\nnum_head = 4\n", 0, NULL);
    assert_message(&result, result.path, 2, "unknown key 'strategy' in [train] (did you mean balance.strategy?)");
    assert_message(&result, result.path, 3, "unknown key 'learning_rate' in [train]");
    assert_null(strstr(result.messages, "learning_rate' in [train] (did"));
    assert_message(&result, result.path, 5, "(did you mean num_heads?)");
    assert_int_equal(result.n_errors, 3);
    load_free(&result);
}

static void test_comments_crlf_and_separators(void **state)
{
    (void)state;
    load_result result = {0};
    load_text(&result,
              "\xEF\xBB\xBF; comment\r\n# another\r\n[ data ]\r\nstore = a b.h5 # trailing\r\n"
              "[model]\r\ninit = ; empty\r\nname: x;y\r\n",
              0, NULL);
    if (result.n_errors) fail_msg("%s", result.messages);
    assert_string_equal(result.config.data.store, "a b.h5");
    assert_string_equal(result.config.model.init, "");
    assert_string_equal(result.config.model.name, "x;y"); /* ';' inside a word is not a comment */
    load_free(&result);
}

/* ---- overrides ------------------------------------------------------------------------------------- */

static void test_overrides(void **state)
{
    (void)state;
    char *overrides[] = {"model.dim=128", " train.lr = 3e-3 ", "balance.strategy=equal_tokens", "data.store=x.h5"};
    load_result result = {0};
    load_text(&result, "[model]\ndim = 64\nnum_heads = 4\n[data]\nstore = y.h5\n", 4, overrides);
    assert_int_equal(result.n_errors, 0);
    assert_int_equal(result.config.model.dim, 128); /* the command line wins; not a duplicate */
    assert_int_equal(result.config.model.num_heads, 4);
    assert_true(result.config.train.lr == 3e-3);
    assert_int_equal(result.config.balance.strategy, STRATEGY_EQUAL_TOKENS);
    assert_string_equal(result.config.data.store, "x.h5");
    load_free(&result);
}

static void test_bad_overrides(void **state)
{
    (void)state;
    char *overrides[] = {"steps", "run=5", "runs.steps=5", "run.stepz=5", "run.steps=-1", "run.seed=1",
                         "run.seed=2", "run.dir="};
    load_result result = {0};
    load_path(&result, NULL, 8, overrides);
    assert_message(&result, "command line", 0, "'steps' is not section.key=value");
    assert_message(&result, "command line", 0, "'run=5' is not section.key=value");
    assert_message(&result, "command line", 0, "unknown section 'runs' in 'runs.steps=5'");
    assert_message(&result, "command line", 0, "unknown key run.stepz (did you mean steps?)");
    assert_message(&result, "command line", 0, "run.steps: -1 is out of range");
    assert_message(&result, "command line", 0, "run.seed is given more than once");
    assert_message(&result, "command line", 0, "run.dir: must not be empty");
    assert_int_equal(result.n_errors, 7);
    assert_int_equal(result.config.run.seed, 1);
    load_free(&result);
}

/* ---- types ----------------------------------------------------------------------------------------- */

/* Load one override on top of the defaults; returns the error count. */
static int load_one(const char *override, deck *config)
{
    char *copy = strdup(override);
    char *overrides[] = {copy};
    load_result result = {0};
    load_path(&result, NULL, 1, overrides);
    *config = result.config;
    int n_errors = result.n_errors;
    load_free(&result);
    free(copy);
    return n_errors;
}

static void test_bools(void **state)
{
    (void)state;
    static const char *const true_words[] = {"true", "on", "yes", "1", "TRUE", "On"};
    static const char *const false_words[] = {"false", "off", "no", "0", "NO"};
    deck config;
    char override[64];
    for (size_t i = 0; i < sizeof true_words / sizeof true_words[0]; i++) {
        snprintf(override, sizeof override, "data.prefetch=%s", true_words[i]);
        assert_int_equal(load_one("data.prefetch=off", &config), 0);
        assert_int_equal(config.data.prefetch, 0);
        assert_int_equal(load_one(override, &config), 0);
        assert_int_equal(config.data.prefetch, 1);
    }
    for (size_t i = 0; i < sizeof false_words / sizeof false_words[0]; i++) {
        snprintf(override, sizeof override, "checkpoint.resume=%s", false_words[i]);
        assert_int_equal(load_one(override, &config), 0);
        assert_int_equal(config.checkpoint.resume, 0);
    }
    assert_int_equal(load_one("balance.calibrate_packed=off", &config), 0); /* the calibration A/B switch */
    assert_int_equal(config.balance.calibrate_packed, 0);
    assert_int_equal(load_one("model.qk_norm=2", &config), 1);
    assert_int_equal(load_one("model.qk_norm=", &config), 1);
    assert_int_equal(load_one("model.qk_norm=enabled", &config), 1);
}

static void test_byte_sizes(void **state)
{
    (void)state;
    static const struct { const char *text; double bytes; } sizes[] = {
        {"80GiB", 80.0 * 1073741824.0}, {"512MiB", 512.0 * 1048576.0}, {"1.5GiB", 1.5 * 1073741824.0},
        {"2G", 2.0 * 1073741824.0}, {"10GB", 10e9}, {"4096KiB", 4194304.0}, {"1e9", 1e9},
        {"2000000", 2000000.0}, {"3 gib", 3.0 * 1073741824.0}, {"1TiB", 1099511627776.0}};
    deck config;
    char override[64];
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        snprintf(override, sizeof override, "balance.mem_budget=%s", sizes[i].text);
        assert_int_equal(load_one(override, &config), 0);
        assert_true(config.balance.mem_budget == sizes[i].bytes);
    }
    assert_int_equal(load_one("balance.mem_budget=auto", &config), 0);
    assert_true(config.balance.mem_budget == 0);
    assert_int_equal(load_one("balance.mem_budget=12XB", &config), 1);
    assert_int_equal(load_one("balance.mem_budget=GiB", &config), 1);
    assert_int_equal(load_one("balance.mem_budget=1KiB", &config), 1); /* below the 1 MiB floor */
    assert_int_equal(load_one("balance.mem_budget=0", &config), 1);    /* 0 is spelled auto */
    assert_int_equal(load_one("balance.device_mem=auto", &config), 1); /* no auto for device_mem */
}

static void test_numbers(void **state)
{
    (void)state;
    deck config;
    assert_int_equal(load_one("run.steps=1e6", &config), 0);
    assert_int_equal(config.run.steps, 1000000);
    assert_int_equal(load_one("run.steps=1.5", &config), 1);
    assert_int_equal(load_one("run.steps=12abc", &config), 1);
    assert_int_equal(load_one("model.dim=99999999999", &config), 1);
    assert_int_equal(load_one("train.lr=1e-4", &config), 0);
    assert_true(config.train.lr == 1e-4);
    assert_int_equal(load_one("train.lr=.5", &config), 0);
    assert_true(config.train.lr == 0.5);
    assert_int_equal(load_one("train.lr=nan", &config), 1);
    assert_int_equal(load_one("train.lr=inf", &config), 1);
    assert_int_equal(load_one("train.lr=0", &config), 1);       /* open lower bound */
    assert_int_equal(load_one("train.beta2=1", &config), 1);    /* open upper bound */
    assert_int_equal(load_one("train.beta2=0.9999", &config), 0);
    assert_int_equal(load_one("run.seed=18446744073709551615", &config), 0);
    assert_true(config.run.seed == UINT64_MAX);
    assert_int_equal(load_one("run.seed=-1", &config), 1);
    assert_int_equal(load_one("run.seed=18446744073709551616", &config), 1);
    assert_int_equal(load_one("run.threads=auto", &config), 0);
    assert_int_equal(config.run.threads, 0);
    assert_int_equal(load_one("balance.dual_p=1.5", &config), 0);
    assert_true(config.balance.dual_p == 1.5);
}

/* issue 35.10: a norm epsilon that vanishes in fp32 is refused at the deck (it failed at step 1 as "lower lr");
   a number below a double's normal range is called too small, not "not finite" */
static void test_number_limits(void **state)
{
    (void)state;
    deck config;
    assert_int_equal(load_one("model.eps=1e-12", &config), 0);
    assert_int_equal(load_one("model.eps=1e-300", &config), 1);
    char *overrides[] = {"model.eps=1e-300", "train.lr=1e-320", "train.lr=1e400"};
    for (int i = 0; i < 3; i++) {
        load_result result = {0};
        load_path(&result, NULL, 1, overrides + i);
        if (i == 0) assert_message(&result, "command line", 0, "model.eps: 1e-300 is out of range [1e-12, 0.1]");
        if (i == 1)
            assert_message(&result, "command line", 0, "train.lr: '1e-320' is not a usable number: it is below 2.2e-308, "
                           "the smallest normal double (denormal or zero) (the range is (0, ");
        if (i == 2) assert_message(&result, "command line", 0, "train.lr: '1e400' is not a finite number: it is above 1.8e308");
        assert_int_equal(result.n_errors, 1);
        load_free(&result);
    }
}

static void test_global_batch(void **state)
{
    (void)state;
    deck config;
    assert_int_equal(load_one("balance.global_batch=64", &config), 0);
    assert_int_equal(config.balance.global_batch, 64);
    assert_int_equal(load_one("balance.global_batch=budget", &config), 0);
    assert_int_equal(config.balance.global_batch, 0);
    assert_int_equal(load_one("balance.global_batch=BUDGET", &config), 0);
    assert_int_equal(config.balance.global_batch, 0);
    assert_int_equal(load_one("balance.global_batch=0", &config), 1);
    assert_int_equal(load_one("balance.global_batch=-3", &config), 1);
    assert_int_equal(load_one("balance.global_batch=lots", &config), 1);
}

/* balance.global_tokens: a token count or off (0); not with a fixed global_batch */
static void test_global_tokens(void **state)
{
    (void)state;
    deck config;
    assert_int_equal(load_one("balance.global_tokens=500000", &config), 0);
    assert_int_equal(config.balance.global_tokens, 500000);
    assert_int_equal(config.balance.global_batch, 0);
    assert_int_equal(load_one("balance.global_tokens=off", &config), 0);
    assert_int_equal(config.balance.global_tokens, 0);
    assert_int_equal(load_one("balance.global_tokens=0", &config), 1);
    char first[] = "balance.global_tokens=1000", second[] = "balance.global_batch=8";
    char *overrides[] = {first, second};
    load_result result = {0};
    load_path(&result, NULL, 2, overrides);
    assert_int_equal(result.n_errors, 1);
    assert_message(&result, "command line", 0, "balance.global_batch (8 samples) and balance.global_tokens (1000) both set");
    load_free(&result);
}

/* balance.sp: a power of two, auto (0) or off (1); 1 and 3 are errors, off prints back as off */
static void test_sequence_parallel(void **state)
{
    (void)state;
    deck config;
    assert_int_equal(load_one("balance.sp=8", &config), 0);
    assert_int_equal(config.balance.sp, 8);
    assert_int_equal(load_one("balance.sp=auto", &config), 0);
    assert_int_equal(config.balance.sp, 0);
    assert_int_equal(load_one("balance.sp=OFF", &config), 0);
    assert_int_equal(config.balance.sp, 1);
    deck_defaults(&config);
    assert_int_equal(config.balance.sp, 1);
    assert_true(config.balance.sp_bandwidth == 300.0);
    assert_int_equal(config.balance.ranks_per_node, 0);
    assert_int_equal(load_one("balance.sp=1", &config), 1);
    assert_int_equal(load_one("balance.sp=none", &config), 1);
    char text[] = "balance.sp=3";
    char *overrides[] = {text};
    load_result result = {0};
    load_path(&result, NULL, 1, overrides);
    assert_int_equal(result.n_errors, 1);
    assert_message(&result, "command line", 0, "balance.sp (3) is not a power of two");
    load_free(&result);
}

static void test_enums(void **state)
{
    (void)state;
    static const struct { const char *text; deck_strategy strategy; } strategies[] = {
        {"global", STRATEGY_GLOBAL}, {"dual", STRATEGY_DUAL}, {"equal_tokens", STRATEGY_EQUAL_TOKENS},
        {"Equal_Tokens", STRATEGY_EQUAL_TOKENS}};
    deck config;
    char override[64];
    for (size_t i = 0; i < sizeof strategies / sizeof strategies[0]; i++) {
        snprintf(override, sizeof override, "balance.strategy=%s", strategies[i].text);
        assert_int_equal(load_one(override, &config), 0);
        assert_int_equal(config.balance.strategy, strategies[i].strategy);
        assert_string_equal(deck_strategy_name(config.balance.strategy), i == 3 ? "equal_tokens" : strategies[i].text);
    }
    assert_int_equal(load_one("run.device=cuda", &config), 0);
    assert_int_equal(config.run.device, DEVICE_CUDA);
    assert_string_equal(deck_device_name(config.run.device), "cuda");
    assert_int_equal(load_one("train.attention=cudnn", &config), 0);
    assert_int_equal(config.train.attention, ATTENTION_CUDNN);
    assert_int_equal(load_one("balance.strategy=fastest", &config), 1);
    char *overrides[] = {"train.nonfinite=ignore"};
    load_result result = {0};
    load_path(&result, NULL, 1, overrides);
    assert_message(&result, "command line", 0, "train.nonfinite: 'ignore' is not one of: error, skip");
    load_free(&result);
}

static void test_lists(void **state)
{
    (void)state;
    deck config;
    assert_int_equal(load_one("eval.sigmas=0.5, 0.25 1,0", &config), 0);
    assert_int_equal(config.eval.sigmas.n, 4);
    assert_true(config.eval.sigmas.values[0] == 0.5 && config.eval.sigmas.values[1] == 0.25);
    assert_true(config.eval.sigmas.values[2] == 1.0 && config.eval.sigmas.values[3] == 0.0);
    assert_int_equal(load_one("eval.sigmas=0.3", &config), 0);
    assert_int_equal(config.eval.sigmas.n, 1);
    assert_true(config.eval.sigmas.values[1] == 0.0); /* the rest of the list is zero: decks compare as bytes */
    char many[512] = "eval.sigmas=";
    for (int i = 0; i <= DECK_LIST_MAX; i++) strcat(many, "0.5,");
    char *overrides[] = {"eval.sigmas=", "eval.every=-1", "eval.samples=x", "eval.sigmas=0.1, 1.5",
                         "eval.sigmas=0.1;0.2"};
    const char *messages[] = {"eval.sigmas: needs at least one number", "eval.every: -1 is out of range",
                              "eval.samples: 'x' is not an integer or all", "eval.sigmas: 1.5 is out of range [0, 1]",
                              "eval.sigmas: '0.1;0.2' is not a list of numbers"};
    for (int i = 0; i < 5; i++) {
        load_result result = {0};
        load_path(&result, NULL, 1, &overrides[i]);
        assert_int_equal(result.n_errors, 1);
        assert_message(&result, "command line", 0, messages[i]);
        load_free(&result);
    }
    char *too_many[] = {many};
    load_result result = {0};
    load_path(&result, NULL, 1, too_many);
    assert_message(&result, "command line", 0, "eval.sigmas: more than 32 numbers");
    load_free(&result);
    assert_int_equal(load_one("eval.every=off", &config), 0);
    assert_int_equal(config.eval.every, 0);
    assert_int_equal(load_one("eval.samples=all", &config), 0);
    assert_int_equal(config.eval.samples, 0);
}

static void test_strings(void **state)
{
    (void)state;
    deck config;
    char long_override[DECK_PATH_MAX + 64];
    snprintf(long_override, sizeof long_override, "data.store=%0*d", DECK_PATH_MAX, 7);
    assert_int_equal(load_one(long_override, &config), 1);
    assert_int_equal(load_one("model.name=abcdefghijabcdefghijabcdefghij12", &config), 1); /* 32 > 31 */
    assert_int_equal(load_one("model.name=abcdefghijabcdefghijabcdefghij1", &config), 0);
    assert_int_equal(load_one("model.name=", &config), 1);
    assert_int_equal(load_one("model.init=", &config), 0);
    assert_int_equal(load_one("log.metrics=a\tb", &config), 1);
    assert_int_equal(load_one("log.metrics=m.jsonl", &config), 0);
    assert_string_equal(config.log.metrics, "m.jsonl");
}

/* ---- cross-key checks ----------------------------------------------------------------------------- */

static void test_cross_key_checks(void **state)
{
    (void)state;
    static const struct { const char *overrides[2]; const char *message; } cases[] = {
        {{"model.dim=100", "model.num_heads=8"}, "model.dim (100) is not divisible by model.num_heads (8)"},
        {{"model.dim=60", "model.num_heads=4"}, "head dim model.dim / model.num_heads = 15 must be even"},
        {{"model.dim=16", "model.num_heads=4"}, "head dim model.dim / model.num_heads = 4 must be even and at least 6"},
        {{"model.freq_dim=33", NULL}, "model.freq_dim (33) must be even"},
        {{"model.in_dim=36", NULL}, "model.in_dim (36) differs from model.out_dim (16)"},
        {{"train.min_lr=1e-3", NULL}, "train.min_lr (0.001) is larger than train.lr (0.0001)"},
        {{"checkpoint.resume_data=changed", NULL}, "checkpoint.resume_data = changed needs run.steps"},
        {{"train.recompute=block", "balance.recompute=none"},
         "balance.recompute (none) differs from train.recompute (block)"},
        {{"train.precision=fp8", "run.device=cpu"}, "train.precision = fp8 needs the CUDA backend"},
        {{"train.fp8_attention=on", NULL}, "train.fp8_attention = on needs train.precision = fp8"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char first[64], second[64];
        snprintf(first, sizeof first, "%s", cases[i].overrides[0]);
        snprintf(second, sizeof second, "%s", cases[i].overrides[1] ? cases[i].overrides[1] : "");
        char *overrides[] = {first, second};
        load_result result = {0};
        load_path(&result, NULL, cases[i].overrides[1] ? 2 : 1, overrides);
        assert_int_equal(result.n_errors, 1);
        assert_message(&result, "command line", 0, cases[i].message);
        load_free(&result);
    }
    deck config;
    assert_int_equal(load_one("model.num_heads=16", &config), 0); /* 1536/16 = 96 */
    /* balance.recompute left unset follows train.recompute (issue 32 S11): one setting, written once */
    assert_int_equal(load_one("train.recompute=block", &config), 0);
    assert_int_equal(config.balance.recompute, RECOMPUTE_BLOCK);
    assert_int_equal(load_one("balance.recompute=block", &config), 1);
    /* precision: bf16 by default; fp8 with device auto or cuda (the backend checks the GPU) */
    deck_defaults(&config);
    assert_int_equal(config.train.precision, PRECISION_BF16);
    assert_int_equal(config.train.fp8_amax_history, 16);
    assert_int_equal(config.train.fp8_margin, 0);
    assert_int_equal(load_one("train.precision=fp8", &config), 0);
    assert_int_equal(config.train.precision, PRECISION_FP8);
    assert_int_equal(load_one("train.fp8_amax_history=0", &config), 1);
    assert_int_equal(config.train.fp8_attention, FP8_ATTENTION_OFF);
    char fp8[] = "train.precision=fp8", forward[] = "train.fp8_attention=forward", heads[] = "model.num_heads=12";
    char *both[] = {fp8, forward, heads};  /* 1536 / 12 = 128 */
    load_result result = {0};
    load_path(&result, NULL, 3, both);
    assert_int_equal(result.n_errors, 0);
    assert_int_equal(result.config.train.fp8_attention, FP8_ATTENTION_FORWARD);
    load_free(&result);
    char eight[] = "model.num_heads=8";  /* 1536 / 8 = 192 */
    char *other_heads[] = {fp8, forward, eight};
    load_path(&result, NULL, 3, other_heads);
    assert_int_equal(result.n_errors, 1);
    assert_message(&result, "command line", 0, "train.fp8_attention = forward needs head_dim 128");
    load_free(&result);
}

/* A family's own defaults: hunyuanvideo15 trains by HunyuanVideo-1.5's recipe (logit-normal u, shift 3, 30% of
   the videos image-to-video) unless the deck sets a key; wan keeps the table's; an i2v share is refused for wan. */
static void test_family_defaults(void **state)
{
    (void)state;
    static const char hunyuan[] = "[model]\nfamily = hunyuanvideo15\nin_dim = 33\nout_dim = 16\ntext_padding = trim\n"
                                  "dim = 256\nnum_heads = 2\n";
    load_result result = {0};
    load_text(&result, hunyuan, 0, NULL);
    assert_int_equal(result.n_errors, 0);
    assert_true(result.config.train.timestep_shift == 3.0);
    assert_int_equal(result.config.train.timesteps, TIMESTEPS_LOGIT_NORMAL);
    assert_true(result.config.train.i2v_share == 0.3);
    load_free(&result);
    char *overrides[] = {"train.timestep_shift=5", "train.i2v_share=0.5", "train.timesteps=uniform"};
    load_text(&result, hunyuan, 3, overrides);
    assert_int_equal(result.n_errors, 0);
    assert_true(result.config.train.timestep_shift == 5.0);
    assert_true(result.config.train.i2v_share == 0.5);
    assert_int_equal(result.config.train.timesteps, TIMESTEPS_UNIFORM);
    load_free(&result);
    load_text(&result, "[train]\ntimestep_shift = 4\n", 0, NULL);
    assert_int_equal(result.n_errors, 0);
    assert_true(result.config.train.timestep_shift == 4.0);
    assert_int_equal(result.config.train.timesteps, TIMESTEPS_UNIFORM);
    assert_true(result.config.train.i2v_share == 0.0);
    load_free(&result);
    char *wan_share[] = {"train.i2v_share=0.3"};
    load_path(&result, NULL, 1, wan_share);
    assert_int_equal(result.n_errors, 1);
    assert_message(&result, "command line", 0, "train.i2v_share (0.3) is for model.family = hunyuanvideo15");
    load_free(&result);
}

static void test_cross_key_lines(void **state)
{
    (void)state;
    load_result result = {0};
    load_source(&result, "tests/decks/cross.ini", 0, NULL);
    char file[512];
    source_path(file, sizeof file, "tests/decks/cross.ini");
    assert_int_equal(result.n_errors, 2);
    assert_message(&result, file, 3, "model.dim (1536) is not divisible by model.num_heads (7)");
    assert_message(&result, file, 6, "train.min_lr (0.001) is larger than train.lr (0.0001)");
    load_free(&result);

    /* fixed on the command line: no errors; the command line then names a new conflict */
    char *fix[] = {"model.num_heads=8", "train.min_lr=0"};
    result = (load_result){0};
    load_source(&result, "tests/decks/cross.ini", 2, fix);
    assert_int_equal(result.n_errors, 0);
    load_free(&result);
}

static void test_cross_checks_wait_for_clean_keys(void **state)
{
    (void)state;
    char *overrides[] = {"model.num_heads=7", "model.dim=x"};
    load_result result = {0};
    load_path(&result, NULL, 2, overrides);
    assert_int_equal(result.n_errors, 1); /* the bad dim only; no cross check on a half-read deck */
    load_free(&result);
}

/* ---- printing -------------------------------------------------------------------------------------- */

static void assert_print_reparses(const deck *original)
{
    load_result result = {0};
    char *text = NULL;
    size_t size = 0;
    FILE *out = open_memstream(&text, &size);
    deck_print(original, out);
    fclose(out);
    load_text(&result, text, 0, NULL);
    if (result.n_errors) fail_msg("deck_print output does not parse:\n%s\n%s", result.messages, text);
    deck expected = *original;
    memcpy(expected.source, result.config.source, sizeof expected.source);
    assert_memory_equal(&result.config, &expected, sizeof expected);
    free(text);
    load_free(&result);
}

static void test_print_reparses_good_deck(void **state)
{
    (void)state;
    load_result result = {0};
    load_source(&result, "tests/decks/good.ini", 0, NULL);
    assert_int_equal(result.n_errors, 0);
    assert_print_reparses(&result.config);
    load_free(&result);
}

static void test_print_reparses_awkward_values(void **state)
{
    (void)state;
    char *overrides[] = {"train.lr=3.3333333333333335e-07", "balance.mem_budget=1234567", "run.seed=18446744073709551615",
                         "balance.device_mem=1.5GiB", "balance.compute_budget=0.1", "model.init=/a/b c.h5",
                         "balance.global_batch=7", "train.min_lr=1e-300",
                         "eval.sigmas=0.1 0.30000000000000004,1e-300", "eval.samples=5", "eval.every=off"};
    load_result result = {0};
    load_path(&result, NULL, 11, overrides);
    assert_int_equal(result.n_errors, 0);
    assert_print_reparses(&result.config);
    deck defaults;
    deck_defaults(&defaults);
    assert_print_reparses(&defaults);
    load_free(&result);
}

static void test_print_spelling(void **state)
{
    (void)state;
    deck config;
    deck_defaults(&config);
    char *text = NULL;
    size_t size = 0;
    FILE *out = open_memstream(&text, &size);
    deck_print(&config, out);
    fclose(out);
    assert_non_null(strstr(text, "\n[balance]\n"));
    assert_non_null(strstr(text, "\nglobal_batch     = budget\n"));
    assert_non_null(strstr(text, "\ndevice_mem       = 80GiB\n"));
    assert_non_null(strstr(text, "\nmem_budget       = auto\n"));
    assert_non_null(strstr(text, "\nlr               = 0.0001\n"));
    assert_non_null(strstr(text, "\nqk_norm          = on\n"));
    assert_non_null(strstr(text, "\nstrategy         = global\n"));
    assert_non_null(strstr(text, "\n[eval]\n"));
    assert_non_null(strstr(text, "\nsigmas           = 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9\n"));
    assert_non_null(strstr(text, "\nsamples          = all\n"));
    free(text);
}

/* ---- help and docs ---------------------------------------------------------------------------------- */

static char *read_whole_file(const char *path)
{
    FILE *file = fopen(path, "rb");
    if (!file) return NULL;
    char *text = NULL;
    size_t size = 0;
    FILE *out = open_memstream(&text, &size);
    char chunk[4096];
    size_t got;
    while ((got = fread(chunk, 1, sizeof chunk, file)) > 0) fwrite(chunk, 1, got, out);
    fclose(out);
    fclose(file);
    return text;
}

static void test_docs_list_every_key(void **state)
{
    (void)state;
    char path[512];
    source_path(path, sizeof path, "docs/input-deck.md");
    char *doc = read_whole_file(path);
    assert_non_null(doc);
    char *reference = NULL;
    size_t size = 0;
    FILE *out = open_memstream(&reference, &size);
    deck_print_reference(out);
    fclose(out);
    int n_rows = 0;
    for (char *line = strtok(reference, "\n"); line; line = strtok(NULL, "\n")) {
        if (strncmp(line, "| `", 3) != 0) continue;
        n_rows++;
        if (!strstr(doc, line)) fail_msg("docs/input-deck.md lacks the row (regenerate it):\n%s", line);
    }
    assert_true(n_rows >= 59);
    free(reference);
    free(doc);
}

static void test_help_lists_every_key(void **state)
{
    (void)state;
    char *text = NULL;
    size_t size = 0;
    FILE *out = open_memstream(&text, &size);
    cli_print_help(out);
    fclose(out);
    assert_non_null(strstr(text, "usage: "));
    assert_non_null(strstr(text, "  model.dim = 1536\n"));
    assert_non_null(strstr(text, "  balance.global_batch = budget\n"));
    assert_non_null(strstr(text, "  train.timestep_shift = 5 (model.family = hunyuanvideo15: 3)\n"));
    assert_non_null(strstr(text, "  log.metrics = metrics.jsonl\n"));
    assert_non_null(strstr(text, "one of: global, dual, equal_tokens"));
    free(text);
    out = open_memstream(&text, &size);
    cli_print_version(out);
    fclose(out);
    assert_non_null(strstr(text, "aldit "));
    assert_non_null(strstr(text, "build options: MPI="));
    free(text);
}

/* ---- command line ---------------------------------------------------------------------------------- */

static int parse_command_line(cli_args *args, char **messages, int argc, ...)
{
    static char *argv[16];
    va_list list;
    va_start(list, argc);
    for (int i = 0; i < argc; i++) argv[i] = va_arg(list, char *);
    va_end(list);
    argv[argc] = NULL;
    size_t size = 0;
    FILE *errors = open_memstream(messages, &size);
    int n_errors = cli_parse(argc, argv, args, errors);
    fclose(errors);
    return n_errors;
}

static void test_cli_modes(void **state)
{
    (void)state;
    cli_args args;
    char *messages = NULL;
    assert_int_equal(parse_command_line(&args, &messages, 2, "aldit", "run.ini"), 0);
    assert_int_equal(args.mode, CLI_RUN);
    assert_string_equal(args.deck_path, "run.ini");
    assert_int_equal(args.n_overrides, 0);
    free(messages);
    assert_int_equal(parse_command_line(&args, &messages, 5, "aldit", "--check", "run.ini", "train.lr=1", "run.steps=2"), 0);
    assert_int_equal(args.mode, CLI_CHECK);
    assert_string_equal(args.deck_path, "run.ini");
    assert_int_equal(args.n_overrides, 2);
    assert_string_equal(args.overrides[0], "train.lr=1");
    assert_string_equal(args.overrides[1], "run.steps=2");
    free(messages);
    /* options anywhere; the deck and overrides keep their order */
    assert_int_equal(parse_command_line(&args, &messages, 5, "aldit", "run.ini", "a.b=1", "--check", "c.d=2"), 0);
    assert_int_equal(args.mode, CLI_CHECK);
    assert_int_equal(args.n_overrides, 2);
    assert_string_equal(args.overrides[0], "a.b=1");
    assert_string_equal(args.overrides[1], "c.d=2");
    free(messages);
    assert_int_equal(parse_command_line(&args, &messages, 2, "aldit", "--help"), 0);
    assert_int_equal(args.mode, CLI_HELP);
    free(messages);
    assert_int_equal(parse_command_line(&args, &messages, 2, "aldit", "-V"), 0);
    assert_int_equal(args.mode, CLI_VERSION);
    free(messages);
    assert_int_equal(parse_command_line(&args, &messages, 3, "aldit", "--", "-odd.ini"), 0);
    assert_string_equal(args.deck_path, "-odd.ini");
    free(messages);
}

static void test_cli_errors(void **state)
{
    (void)state;
    cli_args args;
    char *messages = NULL;
    assert_int_equal(parse_command_line(&args, &messages, 1, "aldit"), 1);
    assert_non_null(strstr(messages, "aldit: no deck given"));
    assert_non_null(strstr(messages, "usage: aldit"));
    free(messages);
    assert_int_equal(parse_command_line(&args, &messages, 3, "aldit", "--chek", "run.ini"), 1);
    assert_non_null(strstr(messages, "unknown option '--chek'"));
    free(messages);
    assert_int_equal(parse_command_line(&args, &messages, 3, "aldit", "-x", "--check"), 2);
    assert_non_null(strstr(messages, "unknown option '-x'"));
    free(messages);
    assert_int_equal(parse_command_line(&args, &messages, 3, "aldit", "--check=yes", "run.ini"), 1);
    assert_non_null(strstr(messages, "option '--check=yes' takes no value"));
    free(messages);
    assert_int_equal(parse_command_line(&args, &messages, 3, "aldit", "--check", "-Vx"), 1); /* a cluster of short ones */
    assert_non_null(strstr(messages, "unknown option '-x'"));
    free(messages);
}

/* getopt_long: unique prefixes of long options, and clusters of short ones */
static void test_cli_getopt_forms(void **state)
{
    (void)state;
    cli_args args;
    char *messages = NULL;
    assert_int_equal(parse_command_line(&args, &messages, 3, "aldit", "--chec", "run.ini"), 0);
    assert_int_equal(args.mode, CLI_CHECK);
    assert_string_equal(args.deck_path, "run.ini");
    free(messages);
    assert_int_equal(parse_command_line(&args, &messages, 2, "aldit", "-Vh"), 0);
    assert_int_equal(args.mode, CLI_HELP); /* --help wins over --version, as before */
    free(messages);
    /* after "--" even an option's name is the deck or an override */
    assert_int_equal(parse_command_line(&args, &messages, 5, "aldit", "a.ini", "--", "--check", "x.y=1"), 0);
    assert_int_equal(args.mode, CLI_RUN);
    assert_int_equal(args.n_overrides, 2);
    assert_string_equal(args.overrides[0], "--check");
    assert_string_equal(args.overrides[1], "x.y=1");
    free(messages);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_no_deck_is_defaults),
        cmocka_unit_test(test_good_deck),
        cmocka_unit_test(test_shipped_decks),
        cmocka_unit_test(test_every_error_kind_with_its_line),
        cmocka_unit_test(test_syntax_errors_and_indented_keys),
        cmocka_unit_test(test_nul_byte_in_a_line),
        cmocka_unit_test(test_missing_file),
        cmocka_unit_test(test_errors_collected_from_file_and_command_line),
        cmocka_unit_test(test_many_errors_counted_first_hundred_printed),
        cmocka_unit_test(test_unknown_key_suggestions),
        cmocka_unit_test(test_comments_crlf_and_separators),
        cmocka_unit_test(test_overrides),
        cmocka_unit_test(test_bad_overrides),
        cmocka_unit_test(test_bools),
        cmocka_unit_test(test_byte_sizes),
        cmocka_unit_test(test_numbers),
        cmocka_unit_test(test_number_limits),
        cmocka_unit_test(test_global_batch),
        cmocka_unit_test(test_sequence_parallel),
        cmocka_unit_test(test_global_tokens),
        cmocka_unit_test(test_enums),
        cmocka_unit_test(test_lists),
        cmocka_unit_test(test_strings),
        cmocka_unit_test(test_cross_key_checks),
        cmocka_unit_test(test_family_defaults),
        cmocka_unit_test(test_cross_key_lines),
        cmocka_unit_test(test_cross_checks_wait_for_clean_keys),
        cmocka_unit_test(test_print_reparses_good_deck),
        cmocka_unit_test(test_print_reparses_awkward_values),
        cmocka_unit_test(test_print_spelling),
        cmocka_unit_test(test_docs_list_every_key),
        cmocka_unit_test(test_help_lists_every_key),
        cmocka_unit_test(test_cli_modes),
        cmocka_unit_test(test_cli_errors),
        cmocka_unit_test(test_cli_getopt_forms),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
