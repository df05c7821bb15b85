"""Expected RoPE tables for tests/runner/test_rope.cpp.

A direct numpy transcription of transformers 5.17's modeling_rope_utils.py (_compute_default /
_linear_scaling / _llama3 / _yarn_parameters) for the configs in test_llama_config.cpp, which were
written by LlamaConfig(...).save_pretrained in that version. Float32 arrays stand for torch float32
tensors; Python floats stay doubles. torch casts a Python scalar to float32 when it meets a float32
tensor and computes `scalar / tensor` as tensor.reciprocal() * scalar (Tensor.__rtruediv__), so
those steps are written the same way here. Run: python3 rope_reference.py (numpy only).
"""
import math

import numpy as np

f32 = np.float32


def rdiv(scalar, tensor):  # torch: scalar / tensor
    return (f32(1.0) / tensor) * f32(scalar)


def base_powers(base, dim):  # base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)
    return np.power(f32(base), np.arange(0, dim, 2, dtype=np.int64).astype(f32) / f32(dim))


def default(base, dim):
    return rdiv(1.0, base_powers(base, dim)), 1.0


def linear(base, dim, factor):
    inv_freq, _ = default(base, dim)
    return inv_freq / f32(factor), 1.0


def llama3(base, dim, factor, low_freq_factor, high_freq_factor, old_context_len):
    inv_freq, _ = default(base, dim)
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = rdiv(2 * math.pi, inv_freq)
    inv_freq_llama = np.where(wavelen > f32(low_freq_wavelen), inv_freq / f32(factor), inv_freq)
    smooth_factor = (rdiv(old_context_len, wavelen) - f32(low_freq_factor)) / f32(high_freq_factor - low_freq_factor)
    smoothed = (f32(1) - smooth_factor) * inv_freq_llama / f32(factor) + smooth_factor * inv_freq_llama
    is_medium = ~(wavelen < f32(high_freq_wavelen)) & ~(wavelen > f32(low_freq_wavelen))
    return np.where(is_medium, smoothed, inv_freq_llama).astype(f32), 1.0


def yarn(base, dim, factor, original_max_position_embeddings, beta_fast=None, beta_slow=None, mscale=None,
         mscale_all_dim=None, attention_factor=None, truncate=True):
    def get_mscale(scale, mscale=1):
        return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = float(get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim))
        else:
            attention_factor = get_mscale(factor)
    beta_fast = beta_fast or 32
    beta_slow = beta_slow or 1

    def find_correction_dim(num_rotations):
        return (dim * math.log(original_max_position_embeddings / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = find_correction_dim(beta_fast), find_correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=f32) - f32(low)) / f32(high - low), f32(0), f32(1))
    pos_freqs = base_powers(base, dim)
    inv_freq_extrapolation = rdiv(1.0, pos_freqs)
    inv_freq_interpolation = rdiv(1.0, f32(factor) * pos_freqs)
    extrapolation_factor = f32(1) - ramp
    inv_freq = inv_freq_interpolation * (f32(1) - extrapolation_factor) + inv_freq_extrapolation * extrapolation_factor
    return inv_freq.astype(f32), attention_factor


def show(name, table):
    inv_freq, attention_factor = table
    values = ", ".join(f"{float(v):.9g}f" for v in inv_freq)
    print(f"// {name}: attention_factor {float(f32(attention_factor)):.9g}f\n{{{values}}}")


if __name__ == "__main__":
    show("default theta 10000 dim 16", default(10000.0, 16))
    show("linear factor 2", linear(10000.0, 16, 2.0))
    show("llama3", llama3(500000.0, 16, 8.0, 1.0, 4.0, 1024))
    show("llama3 Llama-3.1 dim 128", llama3(500000.0, 128, 8.0, 1.0, 4.0, 8192))
    show("yarn mscale", yarn(10000.0, 16, 4.0, 1024, 32.0, 1.0, 1.0, 0.5))
    show("yarn attention_factor, no truncate", yarn(10000.0, 16, 4.0, 1024, attention_factor=0.9, truncate=False))
    show("yarn Qwen-like dim 128", yarn(1000000.0, 128, 4.0, 32768))
