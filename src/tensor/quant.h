// Conversion between fp32 and the ggml block formats found in GGUF files.
#pragma once

#include <cstdint>

#include "tensor/dtype.h"

namespace strata::tensor {

// n must be a multiple of the type's block size. Throws std::invalid_argument for types
// without kernels (the message names the type) and for a ragged n.
void dequantize_row(DType type, const void* src, float* dst, int64_t n);

// Writes row_bytes(type, n) bytes. K-quant scales come from a per-sub-block min/max search,
// and the table formats take each element's nearest value under a max-based scale: valid
// blocks close to the input, not llama.cpp's error-minimising choice.
void quantize_row(DType type, const float* src, void* dst, int64_t n);

}  // namespace strata::tensor
