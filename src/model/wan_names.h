/* wan_names.h — Wan 2.1's official parameter names (aldit's) and diffusers' WanTransformer3DModel names, mapped both ways by one table. */
#ifndef ALDIT_WAN_NAMES_H
#define ALDIT_WAN_NAMES_H

#include <stddef.h>

/* The naming of a weights file: Wan's own state_dict (aldit's checkpoints, Wan's released files) or diffusers'. */
typedef enum { WAN_NAMES_WAN, WAN_NAMES_DIFFUSERS } wan_names;

/* The diffusers name of Wan parameter `wan` ("blocks.0.self_attn.q.weight" -> "blocks.0.attn1.to_q.weight") into
   `out` (size bytes). 0, or 1 when the name has no partner (not a Wan 2.1 text-to-video parameter) or does not fit. */
int wan_name_to_diffusers(const char *wan, char *out, size_t size);

/* The inverse: diffusers name -> Wan name. 0, or 1 as above. */
int wan_name_from_diffusers(const char *diffusers, char *out, size_t size);

/* `wan` under `names` (WAN_NAMES_WAN: copied). 0, or 1 as above. */
int wan_name_in(wan_names names, const char *wan, char *out, size_t size);

/* 1 when `name` is one that only diffusers' naming uses (its text/time embedder, proj_out, attn1/attn2, ffn.net),
   so that a file's naming can be told from any of its tensor names; else 0. */
int wan_name_is_diffusers(const char *name);

const char *wan_names_label(wan_names names); /* "Wan", "diffusers" */

#endif
