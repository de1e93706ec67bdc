/* eval_oracle.c — tests/train_eval.sh's independent validation loss: the CPU model's forward on each sample alone.
   usage: eval_oracle [--ema] DECK WEIGHTS [section.key=value ...]
   Loads the deck (with the overrides: eval.store, eval.samples, eval.sigmas, run.seed, ...) and the weights
   (a checkpoint; with --ema its /ema/<name> tensors, the validation of the EMA weights), then for each of the [eval] store's first [eval] samples samples, one at a time, and each
   noise level of [eval] sigmas: model_forward_loss on that sample alone with the validation noise (eval.h's
   eval_noise at epoch 0, drawn by the reader). Prints the mean loss over samples and levels (%.17g) and the
   mean at each level, one per line after it. Exit 0, or 1 with a message. */
#include "core/check.h"
#include "core/comm.h"
#include "deck/deck.h"
#include "io/store.h"
#include "model/model.h"
#include "train/checkpoint.h"
#include "train/eval.h"
#include "train/prefetch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The /ema tensors of checkpoint `path` into net's weights; 0, or 1 after a message. */
static int load_ema(const char *path, model *net)
{
    checkpoint_reader *reader = checkpoint_reader_open_init(path, net, stderr);
    if (!reader) return 1;
    int status = checkpoint_reader_has(reader, CHECKPOINT_EMA) ? 0 : 1;
    if (status) fprintf(stderr, "eval_oracle: %s has no /ema\n", path);
    for (int p = 0; p < net->n_params && status == 0; p++)
        status = checkpoint_read_tensor(reader, CHECKPOINT_EMA, net->params[p].name, net->weights + net->params[p].offset);
    checkpoint_reader_close(reader);
    return status != 0;
}

int main(int argc, char **argv)
{
    comm_init(&argc, &argv);
    const int ema = argc > 1 && strcmp(argv[1], "--ema") == 0;
    argc -= ema;
    argv += ema;
    if (argc < 3) {
        fprintf(stderr, "usage: eval_oracle [--ema] DECK WEIGHTS [section.key=value ...]\n");
        return 1;
    }
    deck config;
    deck_defaults(&config);
    if (deck_load(&config, argv[1], argc - 3, argv + 3, stderr) != 0) return 1;
    model net;
    model_create(&net, &config);
    if ((ema ? load_ema(argv[2], &net) : checkpoint_load_weights(argv[2], &net, stderr)) != 0) return 1;
    store data;
    if (store_open(&data, config.eval.store, stderr) != 0) return 1;
    const int64_t n_samples = config.eval.samples > 0 ? config.eval.samples : data.n_samples;
    const int wan = config.model.text_padding == TEXT_PADDING_WAN;
    prefetcher *reader = prefetch_create(&data, wan ? config.model.text_len : 0, 0, 1, eval_noise(&config, 1));
    const int n_levels = config.eval.sigmas.n;
    double level_sum[DECK_LIST_MAX] = {0.0}, total = 0.0;
    for (int64_t id = 0; id < n_samples; id++) {
        double wait_s;
        prefetch_start(reader, &id, 1, 0);
        const sample_batch *batch = prefetch_finish(reader, &wait_s);
        if (batch->n_failed) return 1;
        const store_sample *sample = &data.samples[id];
        const int32_t text_rows = wan ? config.model.text_len : sample->text_len;
        for (int level = 0; level < n_levels; level++) {
            const float sigma = (float)config.eval.sigmas.values[level];
            model_batch one = {.n_samples = 1, .frames = &sample->frames, .height = &sample->height,
                               .width = &sample->width, .text_len = &text_rows, .latents = batch->latents,
                               .noise = batch->noise, .sigma = &sigma, .text = batch->text};
            const double loss = model_forward_loss(&net, &one, NULL);
            level_sum[level] += loss;
            total += loss;
        }
    }
    printf("%.17g\n", total / ((double)n_samples * n_levels));
    for (int level = 0; level < n_levels; level++) printf("%.17g\n", level_sum[level] / (double)n_samples);
    prefetch_destroy(reader);
    store_close(&data);
    model_free(&net);
    comm_finalize();
    return 0;
}
