"""A small Llama-architecture decoder you can read in one sitting (taught in lesson 04).

The pieces, in the order a token meets them:

    token ids -> embed_tokens -> [ RMSNorm -> attention (RoPE, grouped-query, KV cache) -> + ->
                                   RMSNorm -> SwiGLU MLP -> + ] x n_layers -> RMSNorm -> lm_head

Module names follow the Hugging Face Llama layout (``model.layers.0.self_attn.q_proj`` ...),
so a checkpoint folder in that layout (``config.json`` + ``*.safetensors``, for example
SmolLM2-135M or Llama-3.2-1B downloaded from the Hub) loads with :func:`load_pretrained`
without renaming anything, and the course's own bundled byte-level model is stored the same way.

Shape letters: B batch, T new tokens, S cached + new tokens, D model width, H query heads,
K key/value heads, hd head size, F MLP width, V vocabulary.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

#: Architectures :func:`load_pretrained` understands (the ``architectures`` field of config.json).
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM",)

#: Where the course's bundled byte-level model lives (lesson 04).
BUNDLED_DIR = Path(__file__).parent / "data" / "tiny_stdlib"


# ----------------------------------------------------------------------------- config
@dataclass
class ModelConfig:
    """Hyper-parameters of the decoder (the names are those of a Hugging Face ``LlamaConfig``)."""
    vocab_size: int = 256
    hidden_size: int = 256             # D
    num_hidden_layers: int = 4
    num_attention_heads: int = 8       # H
    num_key_value_heads: int = 2       # K (H % K == 0: grouped-query attention)
    intermediate_size: int = 640       # F, the SwiGLU width
    max_position_embeddings: int = 256
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None   # None, or a Llama-3 style {"rope_type": "llama3", ...}
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    head_dim: int | None = None        # hd; None means hidden_size // num_attention_heads
    # Additions for the learner's own checkpoint (course_lib.own_model, lesson 17); the defaults
    # are the Llama model the lessons teach, so every existing model is unchanged by them.
    qkv_bias: bool = False             # biases on q, k, v only, none on o (Qwen2 / Qwen2.5)
    qk_norm: bool = False              # an RMSNorm over each head's hd values of q and k (Qwen3)
    sliding_window: int | None = None  # each token sees only the last `sliding_window` (Mistral)

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "intermediate_size", "max_position_embeddings"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a whole number >= 1; got {v!r}")
        if self.head_dim is not None and (isinstance(self.head_dim, bool)
                                          or not isinstance(self.head_dim, int) or self.head_dim < 1):
            raise ValueError(f"head_dim must be a whole number >= 1, or None to derive it as "
                             f"hidden_size // num_attention_heads; got {self.head_dim!r}")
        for name in ("rope_theta", "rms_norm_eps"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                    or v <= 0:
                raise ValueError(f"{name} must be a finite number > 0; got {v!r}")
        if self.head_dim is None:
            if self.hidden_size % self.num_attention_heads:
                raise ValueError(f"hidden_size {self.hidden_size} is not a multiple of "
                                 f"num_attention_heads {self.num_attention_heads}")
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads {self.num_attention_heads} must be a multiple "
                             f"of num_key_value_heads {self.num_key_value_heads}")
        for name in ("qkv_bias", "qk_norm"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False; got {getattr(self, name)!r}")
        if self.qkv_bias and self.attention_bias:
            raise ValueError("qkv_bias (biases on q, k, v only: Qwen2) and attention_bias (biases "
                             "on q, k, v and o: Llama's option) exclude each other; set one")
        if self.sliding_window is not None and (isinstance(self.sliding_window, bool) or not
                                                isinstance(self.sliding_window, int)
                                                or self.sliding_window < 1):
            raise ValueError(f"sliding_window must be a whole number >= 1 (the tokens each "
                             f"position sees, itself included), or None for full attention; got "
                             f"{self.sliding_window!r}")

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        """Keep the keys this model uses; ignore the rest of a Hugging Face config.json."""
        names = {f.name for f in fields(cls)}
        if not isinstance(d, dict):
            raise TypeError(f"from_dict takes a config dict (json.load of config.json); got "
                            f"{type(d).__name__}")
        d = dict(d)
        rp = d.pop("rope_parameters", None)      # newer transformers: theta + scaling together
        if rp:
            d["rope_theta"] = rp.get("rope_theta", d.get("rope_theta", 10000.0))
            kind = rp.get("rope_type", rp.get("type", "default"))
            d["rope_scaling"] = None if kind == "default" else rp
        if d.get("use_sliding_window") is False:  # Qwen2/3 ship a window they do not use
            d.pop("sliding_window", None)
        return cls(**{k: v for k, v in d.items() if k in names})

    def to_hf_dict(self) -> dict:
        """A config.json a Hugging Face ``LlamaForCausalLM`` also reads (``Qwen2ForCausalLM``
        with q/k/v biases, ``Qwen3ForCausalLM`` with q/k norms, ``MistralForCausalLM`` with a
        sliding window: the classes that compute what this model computes)."""
        d = asdict(self)
        qkv_bias, qk_norm, window = d.pop("qkv_bias"), d.pop("qk_norm"), d.pop("sliding_window")
        arch, model_type = "LlamaForCausalLM", "llama"
        if qkv_bias and qk_norm:
            raise ValueError("no Hugging Face class has both q/k/v biases (Qwen2) and q/k norms "
                             "(Qwen3); this config cannot be written as config.json")
        # Qwen2/3 put a window on the layers from max_window_layers on: 0 means all of them
        qwen_window = dict(use_sliding_window=window is not None, sliding_window=window,
                           max_window_layers=0 if window is not None else self.num_hidden_layers)
        if qkv_bias:
            if self.mlp_bias:
                raise ValueError("Qwen2ForCausalLM has no MLP biases; mlp_bias must be False")
            arch, model_type = "Qwen2ForCausalLM", "qwen2"
            for k in ("attention_bias", "mlp_bias"):
                d.pop(k)
            d.update(qwen_window)
        elif qk_norm:
            if self.mlp_bias:
                raise ValueError("Qwen3ForCausalLM has no MLP biases; mlp_bias must be False")
            arch, model_type = "Qwen3ForCausalLM", "qwen3"
            d.pop("mlp_bias")
            d.update(qwen_window)
        elif window is not None:
            if self.attention_bias or self.mlp_bias:
                raise ValueError("MistralForCausalLM has no biases; attention_bias and mlp_bias "
                                 "must be False")
            arch, model_type = "MistralForCausalLM", "mistral"
            for k in ("attention_bias", "mlp_bias"):
                d.pop(k)
            d["sliding_window"] = window
        d.update(architectures=[arch], model_type=model_type, hidden_act="silu",
                 torch_dtype="bfloat16", bos_token_id=None, eos_token_id=None)
        return d


# ----------------------------------------------------------------------------- building blocks
class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight, computed in fp32 (no mean subtraction, no bias)."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):                                            # x: (B, T, D)
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)                          # (B, T, D)


def rope_frequencies(cfg: ModelConfig) -> torch.Tensor:
    """Inverse frequencies of rotary embeddings, (hd/2,); Llama-3 scaling when configured."""
    hd = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    rs = cfg.rope_scaling
    kind = None if rs is None else rs.get("rope_type", rs.get("type"))
    if kind in (None, "default"):
        return inv_freq.float()
    if kind != "llama3":
        raise ValueError(f"rope_scaling type {kind!r} is not supported; supported: None, "
                         f"'default', 'llama3'")
    factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
    old_len = rs["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    smooth = (old_len / wavelen - lo) / (hi - lo)
    scaled = torch.where(wavelen > old_len / lo, inv_freq / factor, inv_freq)
    mid = (wavelen <= old_len / lo) & (wavelen >= old_len / hi)
    scaled = torch.where(mid, (1 - smooth) * inv_freq / factor + smooth * inv_freq, scaled)
    return scaled.float()


def rotate_half(x):
    """(x1, x2) -> (-x2, x1) on the two halves of the last dimension (the HF Llama convention)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x, cos, sin):
    """Rotate query/key pairs by position-dependent angles. x: (B, heads, T, hd); cos, sin: (T, hd)."""
    return (x * cos + rotate_half(x) * sin).to(x.dtype)


class KVCache:
    """Keys and values of the tokens seen so far, one (k, v) pair per layer."""

    def __init__(self, n_layers: int):
        self.k: list[torch.Tensor | None] = [None] * n_layers
        self.v: list[torch.Tensor | None] = [None] * n_layers

    def length(self) -> int:
        return 0 if self.k[0] is None else self.k[0].shape[2]

    def update(self, layer: int, k, v):
        """Append k, v (B, K, T, hd) and return everything cached for this layer, (B, K, S, hd)."""
        if self.k[layer] is not None:
            k = torch.cat([self.k[layer], k], dim=2)
            v = torch.cat([self.v[layer], v], dim=2)
        self.k[layer], self.v[layer] = k, v
        return k, v


class Attention(nn.Module):
    """Causal self-attention with rotary positions and grouped-query heads (K kv heads serve H)."""

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.layer, self.H, self.K, self.hd = layer, cfg.num_attention_heads, \
            cfg.num_key_value_heads, cfg.head_dim
        b = cfg.attention_bias
        bqkv = b or cfg.qkv_bias                   # Qwen2: q, k, v carry biases, o does not
        self.q_proj = nn.Linear(cfg.hidden_size, self.H * self.hd, bias=bqkv)
        self.k_proj = nn.Linear(cfg.hidden_size, self.K * self.hd, bias=bqkv)
        self.v_proj = nn.Linear(cfg.hidden_size, self.K * self.hd, bias=bqkv)
        self.o_proj = nn.Linear(self.H * self.hd, cfg.hidden_size, bias=b)
        if cfg.sliding_window is not None:        # Mistral: attend to the last `window` only
            self.window = cfg.sliding_window
        if cfg.qk_norm:                            # Qwen3: normalise each head before RoPE
            self.q_norm = RMSNorm(self.hd, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(self.hd, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, cache: KVCache | None = None):
        B, T, _ = x.shape                                                  # x: (B, T, D)
        q = self.q_proj(x).view(B, T, self.H, self.hd).transpose(1, 2)     # (B, H, T, hd)
        k = self.k_proj(x).view(B, T, self.K, self.hd).transpose(1, 2)     # (B, K, T, hd)
        v = self.v_proj(x).view(B, T, self.K, self.hd).transpose(1, 2)     # (B, K, T, hd)
        if hasattr(self, "q_norm"):                # over hd, the last dimension (Qwen3)
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        window = getattr(self, "window", None)    # set only for a sliding-window model
        if getattr(cache, "attend", None) is not None:  # a quantized cache (course_lib.kv, lesson 11)
            if window is not None:
                raise NotImplementedError("a quantized KV cache does not apply a sliding window; "
                                          "use a plain KVCache with this model")
            y = cache.attend(self.layer, q, k, v)                          # (B, H, T, hd)
            return self.o_proj(y.transpose(1, 2).reshape(B, T, self.H * self.hd))
        past = 0                                   # tokens already in the cache
        if cache is not None:
            past = 0 if cache.k[self.layer] is None else cache.k[self.layer].shape[2]
            k, v = cache.update(self.layer, k, v)                          # (B, K, S, hd)
        rep = self.H // self.K                     # each kv head serves `rep` query heads
        k = k.repeat_interleave(rep, dim=1)                                # (B, H, S, hd)
        v = v.repeat_interleave(rep, dim=1)                                # (B, H, S, hd)
        if past == 0 and (window is None or T <= window):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)    # (B, H, T, hd)
        else:  # new token i (absolute position past+i) may see cached positions <= past+i
            S = k.shape[2]
            cols = torch.arange(S, device=q.device)[None, :]               # (1, S) key positions
            rows = past + torch.arange(T, device=q.device)[:, None]        # (T, 1) query positions
            mask = cols <= rows                                            # (T, S)
            if window is not None:                 # and only the last `window` of them (Mistral)
                mask = mask & (cols > rows - window)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)    # (B, H, T, hd)
        y = y.transpose(1, 2).reshape(B, T, self.H * self.hd)             # (B, T, H*hd)
        return self.o_proj(y)                                              # (B, T, D)


class MLP(nn.Module):
    """SwiGLU: down( silu(gate(x)) * up(x) )."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        b = cfg.mlp_bias
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=b)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=b)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=b)

    def forward(self, x):                                              # x: (B, T, D)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))  # (B, T, F) -> (B, T, D)


class Block(nn.Module):
    """One decoder layer: pre-norm attention and pre-norm MLP, each with a residual add."""

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, cache=None):                        # x: (B, T, D)
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache)
        return x + self.mlp(self.post_attention_layernorm(x))          # (B, T, D)


class Decoder(nn.Module):
    """Embedding, the stack of blocks and the final norm (HF's ``LlamaModel``)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LlamaModel(nn.Module):
    """The whole causal language model: ``model(ids) -> logits``. Taught in lesson 04.

    ``forward(ids, cache=None)``: ids (B, T) int64 in [0, vocab_size) -> logits (B, T, V) fp32.
    With a :class:`KVCache`, positions continue after the cached tokens.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.model = Decoder(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.register_buffer("inv_freq", rope_frequencies(cfg), persistent=False)

    def init_weights(self, seed: int = 0) -> "LlamaModel":
        """Random initialisation for training from scratch: N(0, 0.02), residual outputs scaled down."""
        g = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                nn.init.ones_(p)
            elif name.endswith(".bias"):
                nn.init.zeros_(p)
            else:
                std = 0.02
                if name.endswith(("o_proj.weight", "down_proj.weight")):
                    std /= math.sqrt(2 * self.config.num_hidden_layers)
                with torch.no_grad():
                    p.copy_(torch.randn(p.shape, generator=g) * std)
        return self

    def rope(self, start: int, T: int):
        """cos, sin tables for positions start..start+T-1, each (T, hd)."""
        pos = torch.arange(start, start + T, dtype=torch.float32, device=self.inv_freq.device)
        ang = pos[:, None] * self.inv_freq[None, :]                    # (T, hd/2)
        ang = torch.cat([ang, ang], dim=-1)                            # (T, hd)
        return ang.cos(), ang.sin()

    def check_ids(self, ids: torch.Tensor):
        """Clear errors for ids a learner might pass by mistake."""
        if not isinstance(ids, torch.Tensor) or ids.dtype not in (torch.int64, torch.int32):
            raise TypeError("token ids must be an int64 (or int32) torch tensor of shape (B, T); "
                            f"got {type(ids).__name__} {getattr(ids, 'dtype', '')}")
        if ids.dim() != 2:
            raise ValueError(f"token ids must have shape (batch, tokens); got {tuple(ids.shape)}. "
                             "Use ids[None] for a single sequence.")
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.config.vocab_size):
            raise ValueError(f"token id out of range: ids span [{int(ids.min())}, "
                             f"{int(ids.max())}] but the vocabulary has {self.config.vocab_size} "
                             f"entries (valid ids 0..{self.config.vocab_size - 1})")

    def forward(self, ids: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        self.check_ids(ids)
        B, T = ids.shape
        start = cache.length() if cache is not None else 0
        cos, sin = self.rope(start, T)                                 # (T, hd) each
        x = self.model.embed_tokens(ids)                               # (B, T, D)
        for block in self.model.layers:
            x = block(x, cos, sin, cache)                              # (B, T, D)
        x = self.model.norm(x)                                         # (B, T, D)
        return self.lm_head(x).float()                                 # (B, T, V)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in {id(p): p for p in self.parameters()}.values())


# ----------------------------------------------------------------------------- generation
@torch.no_grad()
def _check_generate_args(max_new_tokens, temperature, top_k, seed) -> None:
    """Clear errors for :func:`generate`'s knobs (a learner turns them)."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be a whole number >= 0; got {max_new_tokens!r}")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) \
            or not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy); got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be None (no limit) or a whole number >= 1 (1 = greedy); "
                         f"got {top_k!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be a whole number; got {seed!r}")


def generate(model: LlamaModel, ids: torch.Tensor, max_new_tokens: int,
             temperature: float = 0.0, top_k: int | None = None, seed: int = 0,
             stop_token: int | None = None, cache=None) -> torch.Tensor:
    """Continue ``ids`` (B, T) by ``max_new_tokens`` using the KV cache (lesson 04).

    ``temperature == 0`` is greedy (argmax); otherwise sample from softmax(logits / temperature),
    optionally restricted to the ``top_k`` most likely tokens, with a fixed ``seed``.
    Returns (B, T + new) ids. ``cache``: an empty cache to fill instead of a plain
    :class:`KVCache`, for example ``course_lib.kv.QuantizedKVCache`` (lesson 11).
    """
    if ids.dim() == 1:
        ids = ids[None]
    _check_generate_args(max_new_tokens, temperature, top_k, seed)
    context = model.config.max_position_embeddings
    if ids.shape[1] + max_new_tokens > context:
        raise ValueError(
            f"the prompt ({ids.shape[1]} tokens) plus max_new_tokens ({max_new_tokens}) exceeds "
            f"the model's context of {context} positions, beyond which it was never trained; "
            f"keep the last {max(context - max_new_tokens, 0)} prompt tokens "
            f"(ids[:, -{max(context - max_new_tokens, 1)}:]) or ask for fewer new tokens")
    g = torch.Generator(device=ids.device).manual_seed(seed)
    if cache is None:
        cache = KVCache(model.config.num_hidden_layers)
    elif cache.length() != 0:
        raise ValueError("generate needs an empty cache; make a new one for every call")
    logits = model(ids, cache)[:, -1]                                  # (B, V)
    out = [ids]
    for _ in range(max_new_tokens):
        if temperature == 0:
            nxt = logits.argmax(-1, keepdim=True)                      # (B, 1)
        else:
            z = logits / temperature
            if top_k is not None:
                kth = z.topk(min(top_k, z.shape[-1]), dim=-1).values[:, -1:]
                z = z.masked_fill(z < kth, float("-inf"))
            nxt = torch.multinomial(z.softmax(-1), 1, generator=g)     # (B, 1)
        out.append(nxt)
        if stop_token is not None and bool((nxt == stop_token).all()):
            break
        logits = model(nxt, cache)[:, -1]                              # (B, V)
    return torch.cat(out, dim=1)


# ----------------------------------------------------------------------------- byte tokenizer
class ByteTokenizer:
    """The bundled model's tokenizer: one token per UTF-8 byte (vocabulary 256)."""
    vocab_size = 256

    def encode(self, text: str | bytes) -> list[int]:
        if not isinstance(text, (str, bytes, bytearray)):
            raise TypeError(f"encode takes text (str) or bytes; got {type(text).__name__} "
                            f"(bytes(5) would be five zero bytes, not the number 5)")
        return list(text.encode("utf-8") if isinstance(text, str) else bytes(text))

    def decode(self, ids) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


class HFTokenizer:
    """A ``tokenizer.json`` loaded with the ``tokenizers`` package, with encode/decode like above."""

    def __init__(self, path: str | Path):
        from tokenizers import Tokenizer
        self.tok = Tokenizer.from_file(str(path))
        self.vocab_size = self.tok.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"encode takes text (str); got {type(text).__name__}")
        return self.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids) -> str:
        return self.tok.decode([int(i) for i in ids])


# ----------------------------------------------------------------------------- loading
def read_config(folder: str | Path) -> ModelConfig:
    """Read and check ``folder/config.json``; unsupported architectures get a clear error."""
    folder = Path(folder)
    if folder.is_file():
        raise NotADirectoryError(f"{str(folder)!r} is a file; pass the checkpoint *folder* that "
                                 f"holds config.json and *.safetensors (here: {str(folder.parent)!r})")
    if not folder.is_dir():
        raise FileNotFoundError(f"checkpoint folder {str(folder)!r} does not exist. Expected a folder "
                                "with config.json and *.safetensors (Hugging Face layout).")
    path = folder / "config.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: a checkpoint folder needs config.json next "
                                "to its *.safetensors files.")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON ({e}); re-download the checkpoint.") from None
    archs = raw.get("architectures") or [raw.get("model_type", "?")]
    if not any(a in SUPPORTED_ARCHITECTURES for a in archs):
        raise ValueError(f"unsupported architecture {archs} in {path}; supported: "
                         f"{list(SUPPORTED_ARCHITECTURES)} (Llama-family checkpoints such as "
                         "SmolLM2-135M, TinyLlama or Llama-3.2-1B)")
    if raw.get("hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act {raw['hidden_act']!r} is not supported (only 'silu')")
    return ModelConfig.from_dict(raw)


def load_state_dict(folder: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of ``folder/*.safetensors`` (one file or shards) in one dict."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors file in {str(folder)!r}; this loader reads the "
                                "safetensors format only (not .bin / .pth / .gguf).")
    sd = {}
    for f in files:
        try:
            sd.update(load_file(str(f)))
        except (SafetensorError, OSError, ValueError) as e:
            raise ValueError(f"{f} is not a readable safetensors file ({e}); it may be truncated "
                             "or corrupt: re-download it.") from None
    return sd


def load_pretrained(folder: str | Path = BUNDLED_DIR, dtype: torch.dtype = torch.float32
                    ) -> LlamaModel:
    """Load a Llama-family checkpoint folder (HF layout) into :class:`LlamaModel` (lesson 04).

    Default: the course's bundled byte-level model. Weights are converted to ``dtype``
    (fp32 is the course's "unquantized" reference). The model is returned in eval mode.
    """
    _check_float_dtype(dtype)
    cfg = read_config(folder)
    sd = load_state_dict(folder)
    model = LlamaModel(cfg)
    if cfg.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    expected = set(model.state_dict())
    if cfg.tie_word_embeddings:
        expected.discard("lm_head.weight")
    missing = sorted(expected - set(sd))
    extra = sorted(k for k in set(sd) - expected if not k.endswith("rotary_emb.inv_freq"))
    if missing or extra:
        raise ValueError(f"checkpoint in {str(folder)!r} does not match its config: missing "
                         f"{missing[:5]}{'...' if len(missing) > 5 else ''}, unexpected "
                         f"{extra[:5]}{'...' if len(extra) > 5 else ''}")
    for k in expected:
        if sd[k].shape != model.state_dict()[k].shape:
            raise ValueError(f"tensor {k} has shape {tuple(sd[k].shape)} in the checkpoint but the "
                             f"config implies {tuple(model.state_dict()[k].shape)}")
    return model_from_state_dict(cfg, {k: sd[k] for k in expected}, dtype)


def model_from_state_dict(cfg: ModelConfig, sd: dict[str, torch.Tensor],
                          dtype: torch.dtype = torch.float32) -> LlamaModel:
    """A :class:`LlamaModel` holding exactly ``sd``'s weights, in eval mode (lesson 04).

    The model is built on the "meta" device (no memory, no random initialisation: that alone
    takes seconds for a 135M-parameter model) and the tensors are then put in place. Every
    parameter must be in ``sd`` (the head may be left out when it is tied to the embeddings).
    """
    with torch.device("meta"):
        model = LlamaModel(cfg)
    expected = set(model.state_dict())
    if cfg.tie_word_embeddings:
        expected.discard("lm_head.weight")
    missing, extra = sorted(expected - set(sd)), sorted(set(sd) - expected)
    if missing or extra:
        raise ValueError(f"weights do not match the config: missing {missing[:5]}, unexpected "
                         f"{extra[:5]}")
    for k in expected:
        if tuple(sd[k].shape) != tuple(model.state_dict()[k].shape):
            raise ValueError(f"tensor {k} has shape {tuple(sd[k].shape)} but the config implies "
                             f"{tuple(model.state_dict()[k].shape)}")
    model.load_state_dict({k: sd[k] for k in expected}, strict=False, assign=True)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.register_buffer("inv_freq", rope_frequencies(cfg), persistent=False)
    return model.to(dtype).eval()


def load_tokenizer(folder: str | Path = BUNDLED_DIR):
    """``tokenizer.json`` through the ``tokenizers`` package, or bytes for the bundled model."""
    path = Path(folder) / "tokenizer.json"
    if path.exists():
        return HFTokenizer(path)
    cfg = read_config(folder)
    if cfg.vocab_size == 256:
        return ByteTokenizer()
    raise FileNotFoundError(f"{path} is missing: download tokenizer.json with the checkpoint.")


def _check_float_dtype(dtype) -> None:
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch dtype such as torch.float32 or "
                        f"torch.bfloat16; got {dtype!r}")


def save_pretrained(model: LlamaModel, folder: str | Path, dtype: torch.dtype = torch.bfloat16):
    """Write ``config.json`` and ``model.safetensors`` (in ``dtype``) in the HF layout."""
    from safetensors.torch import save_file
    if not isinstance(model, LlamaModel):
        raise TypeError(f"save_pretrained saves a course LlamaModel; got {type(model).__name__}")
    _check_float_dtype(dtype)
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise NotADirectoryError(f"{folder} is a file; save_pretrained writes a checkpoint "
                                 f"*folder* (config.json + model.safetensors): give a folder path")
    folder.mkdir(parents=True, exist_ok=True)
    d = model.config.to_hf_dict()
    d["torch_dtype"] = str(dtype).replace("torch.", "")
    (folder / "config.json").write_text(json.dumps(d, indent=2) + "\n")
    sd = {k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    save_file(sd, str(folder / "model.safetensors"), metadata={"format": "pt"})
