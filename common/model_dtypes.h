/* When a model counts as float32 or as quantized, read once for the analysis (analysis/facts.c) and the text
 * report (tools/report_common.c), which see the same model from the dump's roles.models[]: each model's
 * parameter bytes, those in float32 (parameters_float32_bytes) and those in a dtype of 8 bits or fewer
 * (parameters_quantized_bytes).  Pure: header only. */
#ifndef OG_MODEL_DTYPES_H
#define OG_MODEL_DTYPES_H

#include <stdbool.h>
#include <stdint.h>

/* float32 at nine tenths of its parameters or more: a model loaded in its default dtype keeps a few parameters of
 * another (a quantizer's scales, a rotary table registered as a parameter) */
static inline bool og_model_float32(uint64_t fp32, uint64_t bytes)
{
    return bytes && 10 * (double)fp32 >= 9 * (double)bytes;
}

/* quantized at half its parameters or more in 8 bits or fewer: a 4-bit or int8 model keeps its embeddings, norms and
 * lm_head in 16 bits (Llama-3.1-8B in W8A8: 86% int8; a 1B model in 4-bit with tied embeddings: about half) */
static inline bool og_model_quantized(uint64_t quant, uint64_t bytes) { return bytes && 2 * quant >= bytes; }

#endif
