// ggufmtp-mtp-imatrix: importance-matrix statistics for the MTP (NextN) block, collected by the
// pinned llama.cpp itself. Part of ggufmtp (not of llama.cpp); `ggufmtp runtime build` compiles it
// against the runtime's own libllama / libllama-common / ggml and installs it next to llama-imatrix.
//
// Why it exists: llama-imatrix never loads the MTP tensors and never runs the DECODER_MTP graph,
// so its files have no `blk.<mtp>.*` entries. This tool runs the trunk over the corpus exactly as
// llama-imatrix does (same tokenization, same chunks of n_ctx tokens, BOS on the first token of a
// chunk when the vocab adds one, n_batch / n_seq layout), then feeds an MTP context the
// (hidden state h_p, next token x_{p+1}) pairs exactly as the server's draft-mtp does
// (common/speculative.cpp, common_speculative_impl_draft_mtp::process: token x_k at position k
// carries the trunk's h_{k-1}; the first token of a sequence carries a zero state), and
// accumulates, in a cb_eval callback on the MTP context, the sums of squared MUL_MAT /
// MUL_MAT_ID inputs and token counts that llama-imatrix's IMatrixCollector keeps (per expert for
// `_exps`). The file it writes has llama-imatrix's GGUF layout (`<name>.in_sum2`, `<name>.counts`,
// general.type = imatrix, imatrix.datasets / chunk_count / chunk_size).
//
// Outputs (logits) are asked for only where a collected matrix needs them. llama-imatrix marks
// every token as an output: its trunk graph gathers the output rows inside the last layer (before
// that layer's FFN), so only then does the last layer see every token; it also computes the
// perplexity from the logits. This tool asks the trunk for h_nextn unmasked (see below), and the
// pinned graphs of the MTP architectures then gather the output rows only after h_nextn, right
// before the LM head: every trunk matrix sees every token whatever the outputs, and only the LM
// head (`output.weight`, which llama-imatrix does not collect either) depends on them. So the trunk
// marks one output per batch (its last token) and skips the LM head over the vocabulary for all
// the others: the same statistics for less work (at Qwen3.6-35B-A3B's shape the LM head, 2048 x
// 248,320, is 17% of the trunk's multiply-adds per token). The MTP context does the same where its
// graph gathers the output rows only after the MTP block, right before the LM head (HEAD_ROWS_KEPT),
// and that LM head is `output.weight`: a model with its own `blk.N.nextn.shared_head_head` keeps
// every MTP position as an output, so that matrix sees every position (draft-mtp asks for fewer).
// --all-outputs marks every token of both contexts as an output, as before (for comparisons).
//
// The trunk context is llama-imatrix's: the MTP mode (params.speculative.types = DRAFT_MTP, which
// loads the MTP tensors) would also give it n_rs_seq = draft.n_max, i.e. a hybrid trunk (qwen35moe's
// gated delta net layers) that writes draft.n_max + 1 recurrent state snapshots per sequence and
// ubatch so that a rejected draft can be rolled back; nothing is rolled back here, so
// draft.n_max = 0 (n_rs_seq = 0, as llama-imatrix).
//
// --trunk: the same collector on the trunk context for the trunk layers (no MTP context). Its
// output must equal llama-imatrix's on the same corpus / chunks / ctx: that is the proof that the
// callback, chunking and file writing are llama-imatrix's (tests/test_imatrix_mtp.py).
// --with-trunk: one pass for the whole file: the collector on both contexts (trunk layers from the
// trunk, the MTP block from the MTP context); the trunk entries equal llama-imatrix's, so a
// separate llama-imatrix run is not needed.
// --dump-hidden FILE: also write the trunk hidden states and the tokens (a GGUF with tensors
// `tokens` I32 [N] and `hidden` F32 [n_embd, N], chunk-major) for an independent numpy check.
// --profile: print where the time went (one JSON line after "profile: "): model load and context
// creation, the trunk's and the MTP context's decode time and, inside them, the collector's time,
// calls and activation floats summed, the multiply-adds of the matrix products each context
// computed (counted where the context has the collector, i.e. both with --with-trunk); process CPU
// time. benchmarks/imatrix_mtp_cost.py records it.
//
// Facts about the pinned llama.cpp (0c1e570) this relies on:
// - llama_set_embeddings_nextn / llama_get_embeddings_nextn(_ith) / llama_set_nextn_layer_offset
//   come from the staging header src/llama-ext.h and are exported from libllama with C++ linkage
//   (mangled names, e.g. _Z30llama_get_embeddings_nextn_ithP13llama_contexti): a C++ tool calls
//   them directly; ctypes could not without hard-coding mangled names.
// - common_* (common_params_parse, common_init_from_params, common_speculative_init_from_params,
//   common_batch, common_tokenize) are C++ too, exported from libllama-common.so.
// - common_speculative_init_from_params creates the MTP context the way llama-server does:
//   ctx_type = LLAMA_CONTEXT_TYPE_MTP, n_ctx of the target, n_rs_seq = 0, ctx_other = target; it
//   copies params.cb_eval into the context parameters, so the callback is set on the MTP context
//   only (the trunk context of the MTP mode runs without one).
// - With embeddings_nextn(ctx_tgt, masked = false) the trunk computes h_nextn (the output-normed
//   hidden state) for every token, returned in batch order (llama_context reorders after ubatch
//   splits), exactly what draft-mtp reads.
// - mparams.load_mtp follows params.speculative.types containing DRAFT_MTP.
// - Trunk graphs (src/models/*.cpp) of the MTP architectures gather the output rows
//   (inp_out_ids) inside the last layer only when `cparams.embeddings_nextn_masked` (or when
//   embeddings_nextn is off); with embeddings_nextn unmasked they gather them after h_nextn, right
//   before the LM head (deepseek4: before hc_head, whose hc_head_fn is no blk.* matrix). MTP graphs
//   gather them after the MTP block (before the head norm and the LM head) in every MTP
//   architecture but qwen3next (before the MTP FFN, always) and nemotron_h_moe (before the MTP FFN
//   when masked, as here).

#include "arg.h"
#include "common.h"
#include "gguf.h"
#include "imatrix-loader.h"
#include "llama.h"
#include "log.h"
#include "speculative.h"

#include "llama-ext.h"  // src/: the staging API (C++ linkage)

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <clocale>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <map>
#include <set>
#include <mutex>
#include <string>
#include <vector>

#define TOOL "ggufmtp-mtp-imatrix"

// Exit codes (ggufmtp/imatrix/mtp.py maps them to errors).
enum exit_code {
    EXIT_OK         = 0,
    EXIT_USAGE      = 1,
    EXIT_BAD_CORPUS = 2,
    EXIT_NO_MTP     = 3,
    EXIT_LOAD       = 4,
    EXIT_COMPUTE    = 5,
    EXIT_WRITE      = 6,
};

[[noreturn]] static void fail(int code, const char * fmt, ...) {
    // One write(2) for the whole line: llama.cpp's logger thread shares stderr, and three separate
    // writes let its lines land inside ours (the Python side then read a log line as the error).
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    std::string line = std::string(TOOL ": error: ") + msg + "\n";
    fflush(stderr);
    fwrite(line.data(), 1, line.size(), stderr);
    fflush(stderr);
    exit(code);
}

struct Stats {
    std::vector<float>   values;
    std::vector<int64_t> counts;
};

// IMatrixCollector::collect_imatrix (tools/imatrix/imatrix.cpp), restricted to the blocks
// [layer_lo, layer_hi): same ask rule, same accumulation, same counts.
struct Collector {
    int layer_lo = 0;
    int layer_hi = 0;
    std::map<std::string, Stats> stats;  // sorted by name, as llama-imatrix writes them
    std::vector<char> src1_data;
    std::vector<char> ids;
    std::mutex mutex;
    // --profile: time spent collecting and rows summed, per context (0 trunk, 1 MTP)
    int    phase = 0;
    double collect_s[2] = { 0, 0 };
    int64_t calls[2] = { 0, 0 };
    int64_t floats[2] = { 0, 0 };
    double  macs[2] = { 0, 0 };  // multiply-adds of every MUL_MAT / MUL_MAT_ID the context computes

    bool wanted(const std::string & wname) const {
        if (wname.rfind("blk.", 0) != 0) {
            return false;
        }
        const int il = atoi(wname.c_str() + 4);
        return il >= layer_lo && il < layer_hi;
    }

    bool collect(ggml_tensor * t, bool ask);
    void add_expert_rows(ggml_tensor * t, const std::string & wname, const char * data);
    void add_dense_rows(ggml_tensor * t, const std::string & wname, const char * data);
};

// CUDA0#blk.0.attn_k.weight#0 => blk.0.attn_k.weight
static std::string filter_tensor_name(const char * name) {
    const char * p = strchr(name, '#');
    if (p == nullptr) {
        return name;
    }
    p = p + 1;
    const char * q = strchr(p, '#');
    return q ? std::string(p, q - p) : std::string(p);
}

static bool all_finite(const float * v, size_t n) {
    for (size_t i = 0; i < n; ++i) {
        if (!std::isfinite(v[i])) {
            return false;
        }
    }
    return true;
}

bool Collector::collect(ggml_tensor * t, bool ask) {
    const ggml_tensor * src0 = t->src[0];
    const ggml_tensor * src1 = t->src[1];
    const std::string wname = filter_tensor_name(src0->name);

    if (ask) {
        if (t->op == GGML_OP_MUL_MAT) {
            macs[phase] += (double) src0->ne[0] * src0->ne[1] * (double) (ggml_nelements(src1) / src1->ne[0]);
        } else if (t->op == GGML_OP_MUL_MAT_ID) {
            macs[phase] += (double) src0->ne[0] * src0->ne[1] * (double) (t->src[2]->ne[0] * t->src[2]->ne[1]);
        } else {
            return false;
        }
        if (!wanted(wname)) return false;
        if (t->op == GGML_OP_MUL_MAT_ID) return true;
        // llama-imatrix ignores small batches (< 16 tokens) and non-F32 activations
        return src1->ne[1] >= 16 && src1->type == GGML_TYPE_F32;
    }

    std::lock_guard<std::mutex> lock(mutex);
    const auto t0 = std::chrono::steady_clock::now();
    const bool is_host = ggml_backend_buffer_is_host(src1->buffer);
    if (!is_host) {
        src1_data.resize(ggml_nbytes(src1));
        ggml_backend_tensor_get(src1, src1_data.data(), 0, ggml_nbytes(src1));
    }
    const char * data = is_host ? (const char *) src1->data : src1_data.data();
    GGML_ASSERT(src1->nb[0] == ggml_element_size(src1));
    if (t->op == GGML_OP_MUL_MAT_ID) {
        add_expert_rows(t, wname, data);
    } else {
        add_dense_rows(t, wname, data);
    }
    calls[phase] += 1;
    floats[phase] += t->op == GGML_OP_MUL_MAT_ID ? t->src[2]->ne[0] * src1->ne[2] * src1->ne[0] : ggml_nelements(src1);
    collect_s[phase] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return true;
}

void Collector::add_expert_rows(ggml_tensor * t, const std::string & wname, const char * data) {
    //   ids  -> [n_experts_used, n_tokens]
    //   src1 -> [cols, n_expert_used, n_tokens]
    const ggml_tensor * src0 = t->src[0];
    const ggml_tensor * src1 = t->src[1];
    const ggml_tensor * ids_t = t->src[2];
    const int64_t n_as  = src0->ne[2];
    const int64_t n_ids = ids_t->ne[0];
    GGML_ASSERT(ids_t->ne[1] == src1->ne[2]);
    if (ggml_nrows(src1) != src1->ne[1] * src1->ne[2]) {
        fail(EXIT_COMPUTE, "%s: activations with more than 3 dimensions", wname.c_str());
    }
    ids.resize(ggml_nbytes(ids_t));
    ggml_backend_tensor_get(ids_t, ids.data(), 0, ggml_nbytes(ids_t));

    auto & e = stats[wname];
    if (e.values.empty()) {
        e.values.resize(src1->ne[0] * n_as, 0);
        e.counts.resize(n_as, 0);
    } else if (e.values.size() != (size_t) (src1->ne[0] * n_as) || e.counts.size() != (size_t) n_as) {
        fail(EXIT_COMPUTE, "%s: inconsistent size", wname.c_str());
    }
    const int64_t ne0      = src1->ne[0];
    const int64_t n_tokens = src1->ne[2];
    std::vector<uint8_t> touched(n_as, 0);
    for (int64_t idx = 0; idx < n_ids; ++idx) {
        for (int64_t row = 0; row < n_tokens; ++row) {
            const int32_t ex = *(const int32_t *) (ids.data() + row * ids_t->nb[1] + idx * ids_t->nb[0]);
            GGML_ASSERT(ex >= 0 && ex < n_as);
            const int64_t i11 = idx % src1->ne[1];
            const float * x   = (const float *) (data + i11 * src1->nb[1] + row * src1->nb[2]);
            float * acc       = e.values.data() + ex * ne0;
            e.counts[ex]++;
            touched[ex] = 1;
            for (int64_t j = 0; j < ne0; ++j) {
                acc[j] += x[j] * x[j];
            }
        }
    }
    for (int64_t ex = 0; ex < n_as; ++ex) {
        if (touched[ex] && !all_finite(e.values.data() + ex * ne0, ne0)) {
            fail(EXIT_COMPUTE, "non-finite values detected in %s", wname.c_str());
        }
    }
}

void Collector::add_dense_rows(ggml_tensor * t, const std::string & wname, const char * data) {
    const ggml_tensor * src0 = t->src[0];
    const ggml_tensor * src1 = t->src[1];
    auto & e = stats[wname];
    const int64_t n_mat = src0->ne[2] * src0->ne[3];
    if (e.values.empty()) {
        e.values.resize(src1->ne[0] * n_mat, 0);
        e.counts.resize(1, 0);
    } else if (e.values.size() != (size_t) (src1->ne[0] * n_mat)) {
        fail(EXIT_COMPUTE, "%s: inconsistent size", wname.c_str());
    }
    const int64_t ne0 = src1->ne[0];
    for (int64_t i3 = 0; i3 < src1->ne[3]; ++i3) {
        for (int64_t i2 = 0; i2 < src1->ne[2]; ++i2) {
            const int64_t mat_id = (i3 % src0->ne[3]) * src0->ne[2] + (i2 % src0->ne[2]);
            float * acc = e.values.data() + mat_id * ne0;
            for (int64_t row = 0; row < src1->ne[1]; ++row) {
                const float * x = (const float *) (data + row * src1->nb[1] + i2 * src1->nb[2] + i3 * src1->nb[3]);
                for (int64_t j = 0; j < ne0; ++j) {
                    acc[j] += x[j] * x[j];
                }
            }
        }
    }
    if (!all_finite(e.values.data(), e.values.size())) {
        fail(EXIT_COMPUTE, "non-finite values detected in %s", wname.c_str());
    }
    for (auto & c : e.counts) {
        c += ggml_nrows(src1) / n_mat;
    }
}

static bool collect_cb(ggml_tensor * t, bool ask, void * user_data) {
    return ((Collector *) user_data)->collect(t, ask);
}

// Write to `fname` via a temporary file and a rename: nothing half-written is left behind.
static void write_gguf_atomic(gguf_context * gctx, const std::string & fname) {
    const std::string tmp = fname + ".tmp-" TOOL;
    if (!gguf_write_to_file(gctx, tmp.c_str(), false) || std::rename(tmp.c_str(), fname.c_str()) != 0) {
        std::remove(tmp.c_str());
        fail(EXIT_WRITE, "%s: cannot write the file", fname.c_str());
    }
}

// IMatrixCollector::save_imatrix's layout.
static void save_imatrix(const Collector & col, const std::string & fname, const std::string & dataset,
                         int32_t chunk_count, int32_t chunk_size) {
    size_t data_size = 0;
    for (const auto & kv : col.stats) {
        data_size += GGML_PAD(ggml_tensor_overhead() + sizeof(float) * kv.second.values.size(), GGML_MEM_ALIGN);
        data_size += GGML_PAD(ggml_tensor_overhead() + sizeof(float) * kv.second.counts.size(), GGML_MEM_ALIGN);
    }
    ggml_init_params params = { data_size + 1024, nullptr, false };
    ggml_context * ctx = ggml_init(params);
    gguf_context * gctx = gguf_init_empty();
    const char * datasets[] = { dataset.c_str() };
    gguf_set_val_str(gctx, "general.type", "imatrix");
    gguf_set_arr_str(gctx, LLM_KV_IMATRIX_DATASETS, datasets, 1);
    gguf_set_val_u32(gctx, LLM_KV_IMATRIX_CHUNK_COUNT, chunk_count);
    gguf_set_val_u32(gctx, LLM_KV_IMATRIX_CHUNK_SIZE, chunk_size);
    for (const auto & [name, stat] : col.stats) {
        const int32_t nval = (int32_t) stat.values.size();
        const int32_t nmat = (int32_t) stat.counts.size();
        if (nval <= 0 || nmat <= 0) {
            continue;
        }
        ggml_tensor * in_sum2 = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, nval / nmat, nmat);
        ggml_tensor * counts  = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 1, nmat);
        ggml_format_name(in_sum2, "%s.in_sum2", name.c_str());
        ggml_format_name(counts, "%s.counts", name.c_str());
        for (int32_t j = 0; j < nval; ++j) {
            ((float *) in_sum2->data)[j] = stat.values[j];
        }
        for (int32_t j = 0; j < nmat; ++j) {
            ((float *) counts->data)[j] = (float) stat.counts[j];
        }
        gguf_add_tensor(gctx, in_sum2);
        gguf_add_tensor(gctx, counts);
    }
    write_gguf_atomic(gctx, fname);
    gguf_free(gctx);
    ggml_free(ctx);
}

// The trunk hidden states and tokens, chunk-major (for the numpy check in the tests).
struct HiddenDump {
    std::vector<int32_t> tokens;
    std::vector<float>   hidden;

    void save(const std::string & fname, int32_t n_embd, int32_t chunk_size) const {
        const size_t n = tokens.size();
        ggml_init_params params = { 2 * ggml_tensor_overhead() + (n * (n_embd + 1)) * 4 + 1024, nullptr, false };
        ggml_context * ctx = ggml_init(params);
        gguf_context * gctx = gguf_init_empty();
        gguf_set_val_u32(gctx, "ggufmtp.chunk_size", chunk_size);
        ggml_tensor * tok = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n);
        ggml_tensor * hid = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n_embd, n);
        ggml_set_name(tok, "tokens");
        ggml_set_name(hid, "hidden");
        memcpy(tok->data, tokens.data(), n * sizeof(int32_t));
        memcpy(hid->data, hidden.data(), n * n_embd * sizeof(float));
        gguf_add_tensor(gctx, tok);
        gguf_add_tensor(gctx, hid);
        write_gguf_atomic(gctx, fname);
        gguf_free(gctx);
        ggml_free(ctx);
    }
};

// The options of this tool; everything else goes to llama.cpp's own parser (llama-imatrix's set).
struct ToolArgs {
    bool        trunk = false;
    bool        with_trunk = false;
    bool        profile = false;
    bool        all_outputs = false;
    std::string dump_hidden;
};

static ToolArgs take_tool_args(int & argc, char ** argv) {
    ToolArgs out;
    int w = 1;
    for (int i = 1; i < argc; ++i) {
        if (strcmp(argv[i], "--trunk") == 0) {
            out.trunk = true;
        } else if (strcmp(argv[i], "--with-trunk") == 0) {
            out.with_trunk = true;
        } else if (strcmp(argv[i], "--profile") == 0) {
            out.profile = true;
        } else if (strcmp(argv[i], "--all-outputs") == 0) {
            out.all_outputs = true;
        } else if (strcmp(argv[i], "--dump-hidden") == 0) {
            if (i + 1 >= argc) {
                fail(EXIT_USAGE, "--dump-hidden needs a file name");
            }
            out.dump_hidden = argv[++i];
        } else {
            argv[w++] = argv[i];
        }
    }
    argc = w;
    return out;
}

static void print_usage(int, char ** argv) {
    LOG("\nexample usage:\n\n    %s -m model.gguf -f corpus.txt -o mtp-imatrix.gguf [-c 512] [--chunks N]"
        " [-ngl N] [-t N] [--trunk | --with-trunk] [--dump-hidden hidden.gguf] [--profile] [--all-outputs]\n\n", argv[0]);
}

// Everything one collection run needs.
struct Run {
    common_params params;
    ToolArgs      args;
    llama_context * ctx_tgt = nullptr;
    llama_context * ctx_dft = nullptr;  // null in --trunk mode
    int32_t n_embd   = 0;
    int32_t n_heads  = 1;  // chained MTP heads (step35); 1 for qwen35 / qwen35moe
    bool trunk_all_outputs = true;  // else only the last token of a batch is an output
    bool head_all_outputs  = true;
    Collector  collector;
    HiddenDump dump;
    // --profile
    double trunk_s = 0, head_s = 0;
    int64_t trunk_tokens = 0;
};

static double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static double cpu_s() {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

// common_speculative_impl_draft_mtp::process for one trunk batch: token k carries h_{k-1} of its
// sequence, the first token of a sequence in this batch carries pending_h (zeros at a chunk start).
static void feed_mtp(Run & run, const common_batch & trunk_batch, common_batch & mtp_batch,
                     std::vector<std::vector<float>> & pending_h) {
    const int32_t n_tokens = trunk_batch.size();
    const float * h_tgt = llama_get_embeddings_nextn(run.ctx_tgt);
    const size_t n_seq = pending_h.size();
    std::vector<int32_t> beg(n_seq, -1), end(n_seq, -1);
    for (int32_t k = 0; k < n_tokens; ++k) {
        const llama_seq_id s = trunk_batch.tokens[k].seq_id;
        end[s] = k;
        if (beg[s] < 0) {
            beg[s] = k;
        }
    }
    mtp_batch.clear();
    for (int32_t k = 0; k < n_tokens; ++k) {
        const auto & tk = trunk_batch.tokens[k];
        const int32_t idx = mtp_batch.add(tk.id, tk.pos[0], tk.seq_id, run.head_all_outputs || k == n_tokens - 1);
        const float * h_row = k == beg[tk.seq_id] ? pending_h[tk.seq_id].data() : h_tgt + (size_t) (k - 1) * run.n_embd;
        mtp_batch.set_embd(idx, { h_row, 1, (size_t) run.n_embd });
    }
    auto * mem_dft = llama_get_memory(run.ctx_dft);
    for (int head = 0; head < run.n_heads; ++head) {
        if (run.n_heads > 1) {
            for (size_t s = 0; s < n_seq; ++s) {
                if (beg[s] >= 0) {
                    llama_memory_seq_rm(mem_dft, (llama_seq_id) s, trunk_batch.tokens[beg[s]].pos[0], -1);
                }
            }
            llama_set_nextn_layer_offset(run.ctx_dft, head);
        }
        run.collector.phase = 1;
        const double t0 = now_s();
        if (llama_process(run.ctx_dft, LLAMA_PROCESS_TYPE_DECODE, mtp_batch.get()) != 0) {
            fail(EXIT_COMPUTE, "the MTP context failed to evaluate a batch");
        }
        llama_synchronize(run.ctx_dft);
        run.head_s += now_s() - t0;
    }
    if (run.n_heads > 1) {
        llama_set_nextn_layer_offset(run.ctx_dft, 0);
    }
    for (size_t s = 0; s < n_seq; ++s) {
        if (end[s] >= 0) {
            memcpy(pending_h[s].data(), h_tgt + (size_t) end[s] * run.n_embd, run.n_embd * sizeof(float));
        }
    }
}

static void keep_hidden(Run & run, const common_batch & trunk_batch) {
    const float * h_tgt = llama_get_embeddings_nextn(run.ctx_tgt);
    for (int32_t k = 0; k < trunk_batch.size(); ++k) {
        run.dump.tokens.push_back(trunk_batch.tokens[k].id);
    }
    run.dump.hidden.insert(run.dump.hidden.end(), h_tgt, h_tgt + (size_t) trunk_batch.size() * run.n_embd);
}

// compute_imatrix (tools/imatrix/imatrix.cpp) without perplexity, plus the MTP feed.
static int32_t compute(Run & run, int32_t n_ctx) {
    const common_params & params = run.params;
    const llama_vocab * vocab = llama_model_get_vocab(llama_get_model(run.ctx_tgt));
    const bool add_bos = llama_vocab_get_add_bos(vocab);
    std::vector<llama_token> tokens = common_tokenize(run.ctx_tgt, params.prompt, true, params.parse_special);
    if (params.i_chunk > 0) {
        if (size_t((params.i_chunk + 2) * n_ctx) >= tokens.size()) {
            fail(EXIT_BAD_CORPUS, "%s: not enough tokens left after skipping %d chunks", params.prompt_file.c_str(), params.i_chunk);
        }
        tokens.erase(tokens.begin(), tokens.begin() + params.i_chunk * n_ctx);
    }
    if (int(tokens.size()) < 2 * n_ctx) {
        fail(EXIT_BAD_CORPUS, "%s: too short: it tokenizes to %zu tokens, a context of %d needs at least %d (two chunks, as llama-imatrix)",
             params.prompt_file.c_str(), tokens.size(), n_ctx, 2 * n_ctx);
    }
    const int n_chunk_max = tokens.size() / n_ctx;
    const int n_chunk = params.n_chunks < 0 ? n_chunk_max : std::min(params.n_chunks, n_chunk_max);
    const int n_batch = params.n_batch;
    const int num_batches = (n_ctx + n_batch - 1) / n_batch;
    const int n_seq = std::max(1, n_batch / n_ctx);
    GGML_ASSERT(n_batch < n_ctx || n_batch % n_ctx == 0);

    common_batch batch(run.ctx_tgt);
    common_batch mtp_batch;
    if (run.ctx_dft) {
        mtp_batch = common_batch(run.ctx_dft);
    }
    std::vector<std::vector<float>> pending_h(n_seq, std::vector<float>(run.n_embd, 0.0f));
    fprintf(stderr, TOOL ": chunk 0/%d\n", n_chunk);
    for (int i = 0; i < n_chunk; i += n_seq) {
        const int start = i * n_ctx;
        const int end   = start + n_ctx;
        const int n_seq_batch = std::min(n_seq, n_chunk - i);
        llama_memory_clear(llama_get_memory(run.ctx_tgt), true);
        if (run.ctx_dft) {
            llama_memory_clear(llama_get_memory(run.ctx_dft), true);
        }
        for (auto & h : pending_h) {
            std::fill(h.begin(), h.end(), 0.0f);  // a new sequence: draft-mtp's initial state
        }
        for (int j = 0; j < num_batches; ++j) {
            const int batch_start = start + j * n_batch;
            const int batch_size  = std::min(end - batch_start, n_batch);
            batch.clear();
            for (int seq = 0; seq < n_seq_batch; seq++) {
                const int seq_start = batch_start + seq * n_ctx;
                const auto token_org = tokens[seq_start];
                if (add_bos && j == 0) {
                    tokens[seq_start] = llama_vocab_bos(vocab);
                }
                for (int k = 0; k < batch_size; ++k) {
                    const bool last = seq == n_seq_batch - 1 && k == batch_size - 1;
                    batch.add(tokens[seq_start + k], j * n_batch + k, seq, run.trunk_all_outputs || last);
                }
                tokens[seq_start] = token_org;
            }
            run.collector.phase = 0;
            const double t0 = now_s();
            if (llama_process(run.ctx_tgt, LLAMA_PROCESS_TYPE_DECODE, batch.get()) != 0) {
                fail(EXIT_COMPUTE, "the trunk failed to evaluate a batch");
            }
            llama_synchronize(run.ctx_tgt);
            run.trunk_s += now_s() - t0;
            run.trunk_tokens += batch.size();
            if (!run.args.dump_hidden.empty()) {
                keep_hidden(run, batch);
            }
            if (run.ctx_dft) {
                feed_mtp(run, batch, mtp_batch, pending_h);
            }
        }
        llama_synchronize(run.ctx_tgt);
        fprintf(stderr, TOOL ": chunk %d/%d\n", i + n_seq_batch, n_chunk);
        fflush(stderr);
    }
    return n_chunk;
}

// The MTP architectures of the pinned llama.cpp whose trunk graph, with embeddings_nextn unmasked,
// gathers the output rows only after h_nextn (see the facts above): for them the trunk's outputs
// change no blk.* matrix's input.
static const std::set<std::string> TRUNK_ROWS_KEPT = {
    "bailingmoe3", "cohere2moe", "deepseek2", "deepseek32", "deepseek4", "glm-dsa", "glm4moe", "hy_v3",
    "mimo2", "nemotron_h_moe", "qwen35", "qwen35moe", "qwen3next", "step35",
};
// ... and whose MTP graph gathers them only after the MTP block, before the head norm and LM head.
static const std::set<std::string> HEAD_ROWS_KEPT = {
    "bailingmoe3", "cohere2moe", "deepseek2", "deepseek32", "deepseek4", "glm-dsa", "glm4moe", "hy_v3",
    "mimo2", "qwen35", "qwen35moe", "step35",
};

static std::string model_arch(const llama_model * model) {
    char buf[128] = { 0 };
    return llama_model_meta_val_str(model, "general.architecture", buf, sizeof(buf)) > 0 ? buf : "";
}

// Whether the model file (all its splits) holds a tensor whose name ends with `suffix`.
static bool model_has_tensor_ending(const std::string & path, const std::string & suffix) {
    auto scan = [&](const std::string & file, int * n_split) {
        gguf_init_params gp = { /*no_alloc*/ true, /*ctx*/ nullptr };
        gguf_context * g = gguf_init_from_file(file.c_str(), gp);
        if (g == nullptr) {
            fail(EXIT_LOAD, "%s: cannot read its tensor names", file.c_str());
        }
        bool found = false;
        for (int64_t i = 0; i < gguf_get_n_tensors(g) && !found; ++i) {
            const std::string name = gguf_get_tensor_name(g, i);
            found = name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
        }
        if (n_split != nullptr) {
            const int64_t k = gguf_find_key(g, "split.count");
            *n_split = k >= 0 ? (int) gguf_get_val_u16(g, k) : 1;
        }
        gguf_free(g);
        return found;
    };
    int n_split = 1;
    if (scan(path, &n_split)) {
        return true;
    }
    char prefix[4096];
    if (n_split > 1 && llama_split_prefix(prefix, sizeof(prefix), path.c_str(), 0, n_split) > 0) {
        for (int i = 1; i < n_split; ++i) {
            char split[4096];
            llama_split_path(split, sizeof(split), prefix, i, n_split);
            if (scan(split, nullptr)) {
                return true;
            }
        }
    }
    return false;
}

// Model + trunk context (+ MTP context unless --trunk), with the collector on the context whose
// blocks are collected.
static void init_contexts(Run & run, common_init_result_ptr & init, common_speculative_init_result_ptr & spec) {
    common_params & params = run.params;
    if (!run.args.trunk) {
        params.speculative.types = { COMMON_SPECULATIVE_TYPE_DRAFT_MTP };  // => load_mtp, fit with the MTP ctx
        params.speculative.draft.n_max = 0;  // => n_rs_seq = 0: no rollback snapshots (see the top)
    }
    const bool collect_trunk = run.args.trunk || run.args.with_trunk;
    params.cb_eval = collect_trunk ? collect_cb : nullptr;
    params.cb_eval_user_data = collect_trunk ? &run.collector : nullptr;
    init = common_init_from_params(params);
    llama_model * model = init->model();
    run.ctx_tgt = init->context();
    if (model == nullptr || run.ctx_tgt == nullptr) {
        fail(EXIT_LOAD, "%s: cannot load the model", params.model.path.c_str());
    }
    const int32_t n_trunk = llama_model_n_layer(model);
    const int32_t n_nextn = llama_model_n_layer_nextn(model);
    run.n_embd = llama_model_n_embd_out(model);
    llama_set_embeddings_nextn(run.ctx_tgt, true, /*masked*/ false);
    const std::string arch = model_arch(model);
    run.trunk_all_outputs = run.args.all_outputs || n_nextn <= 0 || TRUNK_ROWS_KEPT.count(arch) == 0;
    if (run.args.trunk) {
        run.collector.layer_lo = 0;
        run.collector.layer_hi = n_trunk;
        return;
    }
    if (n_nextn <= 0) {
        fail(EXIT_NO_MTP, "%s: the model has no MTP (NextN) block (nextn_predict_layers = 0)", params.model.path.c_str());
    }
    // each context's graph holds only its own blocks: one range serves both in --with-trunk mode
    run.collector.layer_lo = run.args.with_trunk ? 0 : n_trunk;
    run.collector.layer_hi = n_trunk + n_nextn;
    params.cb_eval = collect_cb;
    params.cb_eval_user_data = &run.collector;
    spec = common_speculative_init_from_params(params, model, run.ctx_tgt);
    run.ctx_dft = spec->context();
    if (run.ctx_dft == nullptr) {
        fail(EXIT_LOAD, "%s: cannot create the MTP context (does llama.cpp support MTP for this architecture?)",
             params.model.path.c_str());
    }
    if (llama_get_ctx_other(run.ctx_dft) == run.ctx_tgt) {
        fail(EXIT_NO_MTP, "%s: an MTP head that shares the target's KV cache is not supported", params.model.path.c_str());
    }
    run.n_heads = std::max(1, (int) n_nextn);
    llama_set_embeddings_nextn(run.ctx_dft, true, /*masked*/ true);
    run.head_all_outputs = run.args.all_outputs || HEAD_ROWS_KEPT.count(arch) == 0
        || model_has_tensor_ending(params.model.path, ".nextn.shared_head_head.weight");
}

int main(int argc, char ** argv) {
    std::setlocale(LC_NUMERIC, "C");
    Run run;
    run.args = take_tool_args(argc, argv);
    common_params & params = run.params;
    params.out_file = "imatrix.gguf";
    params.n_ctx = 512;
    params.escape = false;
    common_init();
    if (!common_params_parse(argc, argv, params, LLAMA_EXAMPLE_IMATRIX, print_usage)) {
        return EXIT_USAGE;
    }
    if (run.args.trunk && run.args.with_trunk) {
        fail(EXIT_USAGE, "--trunk and --with-trunk exclude each other");
    }
    if (params.imat_dat > 0) {
        fail(EXIT_USAGE, "only the GGUF imatrix format is written (drop --output-format dat)");
    }
    if (params.prompt.empty()) {
        fail(EXIT_BAD_CORPUS, "no corpus: pass -f FILE with text");
    }
    const int32_t n_ctx = params.n_ctx;
    if (n_ctx <= 0) {
        fail(EXIT_USAGE, "--ctx-size must be > 0");
    }
    // llama-imatrix's layout: n_seq chunks of n_ctx tokens share one batch
    const int32_t n_seq = std::max(1, params.n_batch / n_ctx);
    params.n_parallel = n_seq;
    params.n_ctx      = n_seq * n_ctx;
    params.n_batch    = std::min(params.n_batch, params.n_ctx);
    params.warmup     = false;

    const double t_start = now_s();
    llama_backend_init();
    llama_numa_init(params.numa);
    common_init_result_ptr init;
    common_speculative_init_result_ptr spec;
    init_contexts(run, init, spec);
    const double t_init = now_s() - t_start, cpu_init = cpu_s();

    const int32_t n_chunk = compute(run, n_ctx);
    const double t_compute = now_s() - t_start - t_init, cpu_compute = cpu_s() - cpu_init;
    if (run.collector.stats.empty()) {
        fail(EXIT_COMPUTE, "no statistics were collected for blocks %d..%d", run.collector.layer_lo, run.collector.layer_hi - 1);
    }
    save_imatrix(run.collector, params.out_file, params.prompt_file, n_chunk, n_ctx);
    if (!run.args.dump_hidden.empty()) {
        run.dump.save(run.args.dump_hidden, run.n_embd, n_ctx);
    }
    fprintf(stderr, TOOL ": wrote %zu entries for blocks %d..%d to %s\n", run.collector.stats.size(),
            run.collector.layer_lo, run.collector.layer_hi - 1, params.out_file.c_str());
    if (run.args.profile) {
        const Collector & c = run.collector;
        fprintf(stderr, TOOL ": profile: {\"init_s\": %.3f, \"compute_s\": %.3f, \"compute_cpu_s\": %.3f, "
                "\"trunk_s\": %.3f, \"trunk_collect_s\": %.3f, \"trunk_collect_calls\": %lld, \"trunk_collect_floats\": %lld, "
                "\"head_s\": %.3f, \"head_collect_s\": %.3f, \"head_collect_calls\": %lld, \"head_collect_floats\": %lld, "
                "\"trunk_matmul_macs\": %.0f, \"head_matmul_macs\": %.0f, "
                "\"tokens\": %lld, \"trunk_all_outputs\": %s, \"head_all_outputs\": %s, \"total_s\": %.3f, \"cpu_s\": %.3f}\n",
                t_init, t_compute, cpu_compute, run.trunk_s, c.collect_s[0], (long long) c.calls[0], (long long) c.floats[0],
                run.head_s, c.collect_s[1], (long long) c.calls[1], (long long) c.floats[1], c.macs[0], c.macs[1],
                (long long) run.trunk_tokens,
                run.trunk_all_outputs ? "true" : "false", run.ctx_dft && run.head_all_outputs ? "true" : "false",
                now_s() - t_start, cpu_s());
    }
    spec.reset();
    init.reset();
    llama_backend_free();
    return EXIT_OK;
}
