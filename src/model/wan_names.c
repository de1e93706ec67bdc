/* wan_names.c — the name table between Wan 2.1's state_dict and diffusers' WanTransformer3DModel (tools/wan_names.py holds the same pairs). */
#include "model/wan_names.h"

#include <stdio.h>
#include <string.h>

typedef struct { const char *wan, *diffusers; } name_pair;

/* Outside the blocks: prefixes matched at the start of the name. */
static const name_pair top_level[] = {
    {"patch_embedding.", "patch_embedding."},
    {"text_embedding.0.", "condition_embedder.text_embedder.linear_1."},
    {"text_embedding.2.", "condition_embedder.text_embedder.linear_2."},
    {"time_embedding.0.", "condition_embedder.time_embedder.linear_1."},
    {"time_embedding.2.", "condition_embedder.time_embedder.linear_2."},
    {"time_projection.1.", "condition_embedder.time_proj."},
    {"head.head.", "proj_out."},
    {"head.modulation", "scale_shift_table"},
};

/* Inside block N, after "blocks.N.". Wan's norm3 (the affine LayerNorm before the cross-attention) is diffusers'
   norm2; the other norms have no parameters on either side. */
static const name_pair in_block[] = {
    {"self_attn.q.", "attn1.to_q."},         {"self_attn.k.", "attn1.to_k."},
    {"self_attn.v.", "attn1.to_v."},         {"self_attn.o.", "attn1.to_out.0."},
    {"self_attn.norm_q.", "attn1.norm_q."},  {"self_attn.norm_k.", "attn1.norm_k."},
    {"cross_attn.q.", "attn2.to_q."},        {"cross_attn.k.", "attn2.to_k."},
    {"cross_attn.v.", "attn2.to_v."},        {"cross_attn.o.", "attn2.to_out.0."},
    {"cross_attn.norm_q.", "attn2.norm_q."}, {"cross_attn.norm_k.", "attn2.norm_k."},
    {"norm3.", "norm2."},                    {"ffn.0.", "ffn.net.0.proj."},
    {"ffn.2.", "ffn.net.2."},                {"modulation", "scale_shift_table"},
};

#define N_TOP ((int)(sizeof top_level / sizeof top_level[0]))
#define N_BLOCK ((int)(sizeof in_block / sizeof in_block[0]))

static const char *source_of(const name_pair *pair, int to_diffusers) { return to_diffusers ? pair->wan : pair->diffusers; }
static const char *target_of(const name_pair *pair, int to_diffusers) { return to_diffusers ? pair->diffusers : pair->wan; }

/* `name` (no block prefix) renamed by the first pair whose source prefix it starts with, after `head`. */
static int rename_by(const name_pair *table, int n, const char *head, const char *name, int to_diffusers, char *out,
                     size_t size)
{
    for (int i = 0; i < n; i++) {
        const char *from = source_of(&table[i], to_diffusers), *to = target_of(&table[i], to_diffusers);
        size_t length = strlen(from);
        if (strncmp(name, from, length) != 0) continue;
        int written = snprintf(out, size, "%s%s%s", head, to, name + length);
        return written < 0 || (size_t)written >= size;
    }
    return 1;
}

static int convert(const char *name, int to_diffusers, char *out, size_t size)
{
    unsigned layer = 0;
    int consumed = 0;
    if (sscanf(name, "blocks.%u.%n", &layer, &consumed) == 1 && consumed > 0) {
        char head[32];
        snprintf(head, sizeof head, "%.*s", consumed, name);
        return rename_by(in_block, N_BLOCK, head, name + consumed, to_diffusers, out, size);
    }
    return rename_by(top_level, N_TOP, "", name, to_diffusers, out, size);
}

int wan_name_to_diffusers(const char *wan, char *out, size_t size) { return convert(wan, 1, out, size); }

int wan_name_from_diffusers(const char *diffusers, char *out, size_t size) { return convert(diffusers, 0, out, size); }

int wan_name_in(wan_names names, const char *wan, char *out, size_t size)
{
    if (names == WAN_NAMES_DIFFUSERS) return wan_name_to_diffusers(wan, out, size);
    int written = snprintf(out, size, "%s", wan);
    return written < 0 || (size_t)written >= size;
}

int wan_name_is_diffusers(const char *name)
{
    static const char *const marks[] = {"condition_embedder.", "proj_out.", ".attn1.", ".attn2.", ".ffn.net."};
    for (size_t i = 0; i < sizeof marks / sizeof marks[0]; i++)
        if (strstr(name, marks[i])) return 1;
    return strstr(name, "scale_shift_table") != NULL;
}

const char *wan_names_label(wan_names names) { return names == WAN_NAMES_DIFFUSERS ? "diffusers" : "Wan"; }
