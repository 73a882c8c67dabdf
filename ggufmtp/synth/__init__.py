"""The synthetic-model factory (tests, demo, GPU benchmarks): MTP (NextN) models whose behaviour is known.

Modules, in the order data flows through them:

- ``layout``    shapes (``Dims``/``DIMS``, ``PUBLISHED``), the tensors every architecture shares, how a tensor is initialised
- ``archs``     one module per architecture: which tensors its blocks hold, its ``<arch>.*`` keys
- ``spec``      ``SynthSpec`` (what to make, validated), ``expected_acceptance`` (the closed form)
- ``tokenizer`` the byte-level BPE vocabulary learnt from a built-in corpus, and the chat template
- ``chain``     the bigram successor chain and the exact replay of llama-server's draft loop
- ``tensors``   ``TensorPlan`` and ``TensorBuilder``: every tensor's bytes, generated lazily
- ``metadata``  the GGUF key/values (model, tokenizer, provenance)
- ``writer``    ``synthesize`` (streams the file through ``files.fsutil``'s atomic writer), ``SynthResult``
- ``builtin``   ``BUILTIN_MODELS`` and ``builtin_path`` (the cache of built-in models)
- ``calibrate`` ``calibrate_wrong_fraction``, ``design_fraction`` and ``chat_last_tokens`` (starts a real llama-server)

The project's test models, since no real weights can be fetched.

``writer.synthesize(out, spec.SynthSpec(...))`` writes a BF16 GGUF of a ``qwen35moe`` (or dense ``qwen35``) model
that llama.cpp (commit 0c1e570) loads and serves with ``llama-server --spec-type draft-mtp``. The
weights are not trained; they are *constructed* so that the model's behaviour is known exactly.

Layout
------
``layers`` trunk blocks (3 Gated DeltaNet : 1 full attention, ``full_attention_interval`` 4; with 2
or 3 layers the interval is ``layers``, because llama.cpp 0c1e570 aborts at warm-up on a hybrid trunk
without any attention layer -- or without any recurrent one, so a 1-layer file can be written and
quantized but not served, see :func:`full_attention_interval`), then ONE MTP block ``blk.<layers>`` (``nextn_predict_layers`` 1,
``block_count = layers + 1``). ``mtp=False`` writes the same trunk without it; ``mtp_only=True`` an
MTP-only sidecar (``token_embd``, ``output_norm``, ``output`` and the MTP block, like
``convert_hf_to_gguf.py --mtp``) that llama-server uses through ``--spec-draft-model`` next to the
``mtp=False`` model (as the main ``-m`` model it crashes llama-server with SIGSEGV). BF16 for
matrices; F32 for 1-D tensors (norms, ``ssm_a``, ``ssm_dt.bias``, ``ffn_gate_inp_shexp``) and for
``ffn_gate_inp`` / ``ssm_conv1d``, as ``convert_hf_to_gguf.py`` writes them.

Tokenizer
---------
A real GPT-2-style byte-level BPE (``tokenizer.ggml.model = gpt2``, ``pre = qwen2``): token ids 0..255
are the 256 bytes (in byte order, spelled with GPT-2's ``bytes_to_unicode``), followed by the
results of BPE merges learnt deterministically from a small built-in English corpus (so the merges are
consistent with the vocabulary by construction), then the control tokens ``<|endoftext|>`` (bos and
pad), ``<|im_start|>``, ``<|im_end|>`` (eos). The real shapes pad the vocabulary to 248320 with
``[PAD<i>]`` tokens of type UNUSED, as ``convert_hf_to_gguf.py`` does.

Shapes
------
``tiny`` (n_embd 256, a few MB) for every architecture; the real per-layer shapes of two released
models, each its architecture's only (``layout.PUBLISHED``): ``qwen3.6-35b-a3b`` (``qwen35moe``, 40
trunk layers released) and ``qwen3.6-27b`` (dense ``qwen35``: n_embd 5120, FFN 17408, 24/4 heads,
16/48 linear-attention heads; 64 trunk layers released, so ``layers=64`` puts the MTP block at
``blk.64``). The chain below depends only on the seed and the fraction, so a real-shaped model
drafts exactly as its tiny twin: what the tests show at tiny scale holds at 57 GB.

Behaviour: a bigram chain
-------------------------
Blocks contribute almost nothing (every projection back into the residual stream -- ``ssm_out``,
``attn_output``, ``ffn_down*`` -- is ~1e-2 of the signal), so the trunk is a bigram model: the
logits of token ``x`` are ``output . rmsnorm(embed(x))``. Every token ``x`` has a successor
``s(x)``: ``s`` is one random cycle through the "text" tokens (tokens spelling only ASCII letters,
digits, space, ``.`` and ``,``) and maps every other token (other bytes, control tokens) onto a text
token. ``output[y] = (24/n_embd) * sum_{x: s(x)=y} embed(x)`` makes ``s(x)`` win by a wide margin
(logit ~24 against ~N(0, 1.5)), so greedy generation from ``x`` is the deterministic chain
``s(x), s(s(x)), ...``; it never yields a control token or EOS, so it runs to ``max_tokens``.
:func:`predict_tokens` gives that chain without running anything.

The MTP head agrees with the trunk: ``nextn.eh_proj`` is ``[I | 0]`` (it passes the embedding half
of ``[enorm(embed(next)) ; hnorm(hidden)]`` through), the block adds ~nothing, and the shared head
falls back to ``output`` / ``output_norm``. So the draft of token ``t+2`` from token ``t+1`` is
exactly ``s(x_{t+1})``: acceptance 100% at temperature 0.

Prompt dependence (design choice)
---------------------------------
A ChatML prompt always ends with ``<|im_start|>assistant\\n``, so a bigram model would answer every
chat with the same text. The chat template therefore ends the *generation prompt* with the user's
last message, stripped of trailing whitespace and ``.?!``::

    <|im_start|>user\\nTell me about the sea.<|im_end|>\\n<|im_start|>assistant\\nTell me about the sea

so the chain starts from the last token of the user's own words (here the token ending in
``sea``). Different prompts give different texts unless their last words end in the same BPE token;
the same prompt is deterministic. (Making the trunk itself carry earlier-token information would
make trunk and MTP disagree whenever that information flips a prediction, and the acceptance would
no longer follow a known formula -- the knob below needs the bigram to stay exact.) Raw
``/completion`` prompts start the chain from their own last token.

The agreement knob
------------------
``wrong_successor_fraction = f`` writes ``nextn.embed_tokens`` = ``token_embd`` except that a random
set of exactly ``round(f * n_text)`` text tokens get the embedding of another text token, so the MTP
head drafts ``s(other) != s(x)`` after them. In llama.cpp's MTP drafting
(``common/speculative.cpp``, ``common_speculative_impl_draft_mtp``) the head drafts greedily (top-k 10,
``p_min`` default 0 and our drafts have p ~ 1, so drafting never stops early), chaining on its own
drafts: the draft ``d_{i+1} = s(c(d_i))`` is right iff every token of the chain from the last
accepted token is uncorrupted. With clean probability ``q = 1 - f`` per token, the accepted length
of a ``k``-token draft has mean ``sum_{i=1..k} q^i``, so

    acceptance = draft_n_accepted / draft_n = (sum_{i=1..k} (1-f)^i) / k

(:func:`expected_acceptance`). Deviations in practice: the server caps the last drafts of a reply at
``n_remaining - 1`` tokens, and a 64-128-token reply visits only part of the cycle, so the realised
runs of clean tokens along it scatter around the iid expectation. :func:`simulate_acceptance`
replays the server's loop on the actual chain and predicts ``(draft_n, draft_n_accepted)`` of a
reply exactly (the tests check equality against llama-server 0c1e570). Measured on the CPU runtime
(5 chat prompts x 128 tokens, seeds 0-2): f=0 gives 1.000 at every k; f=0.2 gives 0.76-0.83 (k=1,
formula 0.80), 0.61-0.66 (k=3, 0.65); f=0.5 gives 0.52 (k=1, 0.50), 0.29-0.31 (k=3, 0.29),
0.22-0.24 (k=4, 0.23) -- within 0.05 of the formula. For a head with a given acceptance *on a given
prompt set*, :func:`calibrate_wrong_fraction` searches the number of corrupted tokens with that exact
replay (``ggufmtp synth --target-acceptance``; :func:`chat_last_tokens` gets each prompt's last token
from a real llama-server). Each real shape's benchmark head is designed that way
(``layout.HeadDesign``, recomputed by ``calibrate.design_fraction``): the 35B-A3B's 0.130515
(74.96% on chat-v1 at k=3; 71.50% on the fair headline's 20 prompts x 256 tokens at k=4, what the
H200 measured), the 27B's 0.143382 for the published 67.5% at k=4 on those headline prompts (67.95%:
the iid formula's own fraction gives 72.7% there, because those prompts start from 15 distinct tokens).

``eh_proj_noise = s`` adds gaussian noise of relative RMS ``s`` to ``eh_proj``'s output. It shrinks
the draft logit margin by ``sqrt(1 + s^2)`` against ``sqrt(n_embd)`` (16 for tiny, 45 and 72 for the real
shapes), so nothing happens until ``s`` approaches ``sqrt(n_embd) / 4``; measured on tiny at k=3:
s=0.5 -> 1.00, s=3 -> 0.77, s=5 -> 0.12, s=8 -> 0.02. It has no closed form; use the fraction knob
for calibrated acceptance.

Streaming
---------
Tensor infos are declared up front, then every tensor is generated chunk by chunk (bounded memory) and
handed to ``files.fsutil.atomic_write_parts`` -- the project's one atomic writer: a temporary file in
the destination directory, fsynced, given the umask's permissions and ``os.replace``-d into place only
when complete; it returns the sha256 of the bytes it wrote. Small tensors use a seeded PCG64
generator; tensors over 4 Mi elements (the real shapes' experts, FFNs and vocabulary padding) tile a seeded
8 MB noise bank -- cheap and deterministic, and never part of the bigram path. Peak RSS ~280 MB for
the 35B-A3B shape (7.1 GB with 2 trunk layers), ~780 MB for the 27B's 57.2 GB (its 5120 x 10240
``eh_proj`` is built whole); tiny in ~0.2 s.
"""
