/*
 * qhexrt_c.h — the qhx runtime as a C library (libqhx.a / libqhx.so).
 *
 * Source-compatible with the QHexRT C surface that apps compile their adapters against:
 * the same function, type and field names. Layouts are qhx's own (the SDK recompiles
 * against the header it is given); tests/capi checks them against the library.
 *
 * Contract
 *  - Every function returning qhx_status returns QHX_STATUS_OK (0) or a nonzero code
 *    (qhx_status_str names it). Functions returning a handle return NULL on failure.
 *    The message of a failed session call: qhx_session_last_error(session); of any
 *    other call, and of a session call refused because another thread holds the session
 *    (QHX_STATUS_BUSY; that session's message is left as it was): qhx_last_error(), kept
 *    per thread.
 *  - One runtime per process: qhx_runtime_create fails with QHX_STATUS_BUSY while another
 *    one (or a model loaded on it) is alive; it can be created again after.
 *  - Models and sessions keep what they need alive: freeing a runtime with models still
 *    loaded (or a model with sessions) releases it when the last of them is freed.
 *  - A session is used by one thread at a time (a second concurrent call on it returns
 *    QHX_STATUS_BUSY); sessions of different models on one runtime may generate at once.
 *    qhx_session_cancel may be called from any thread.
 *  - Output buffers (qhx_output.text) belong to the session: valid until its next
 *    generate or its free.
 *  - No call lets a Rust panic reach C: an internal fault is QHX_STATUS_INTERNAL.
 */
#ifndef QHEXRT_C_H
#define QHEXRT_C_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define QHX_ABI_VERSION_MAJOR 1
#define QHX_ABI_VERSION_MINOR 0

typedef struct qhx_runtime qhx_runtime;
typedef struct qhx_model qhx_model;
typedef struct qhx_session qhx_session;

typedef int32_t qhx_status;
#define QHX_STATUS_OK 0
#define QHX_STATUS_INVALID_ARGUMENT 1 /* a NULL or malformed argument */
#define QHX_STATUS_IO 2               /* a file could not be read */
#define QHX_STATUS_QNN_LOAD 3         /* a QNN library could not be opened or started */
#define QHX_STATUS_QNN_API 4          /* a QNN call failed */
#define QHX_STATUS_MODEL 5            /* the bundle is invalid (manifest, graphs, tokenizer) */
#define QHX_STATUS_UNSUPPORTED 6      /* a request this build cannot serve (images, audio) */
#define QHX_STATUS_CANCELLED 7        /* should_cancel, qhx_session_cancel or the callback */
#define QHX_STATUS_OUT_OF_MEMORY 8
#define QHX_STATUS_INTERNAL 9
#define QHX_STATUS_BUSY 10            /* the runtime exists already / the session is in use */
#define QHX_STATUS_CONTEXT_FULL 11    /* the prompt leaves no room in the context */
#define QHX_STATUS_HOST_OP_FAILED 12  /* a host step failed mid-run (e.g. non-finite logits) */
#define QHX_STATUS_GRAMMAR 13         /* the grammar or schema does not compile */

/* qhx_gen_cfg.grammar_kind. The grammar text may carry the prefix QHexRT uses for its kind
 * ("json:", "toolcall:", "toolcall_opt:"). */
#define QHX_GRAMMAR_NONE 0
#define QHX_GRAMMAR_JSON 1               /* grammar: a JSON schema; NULL or "" = any object */
/* Tool calls: grammar is a JSON array of OpenAI-style tool specs, offered through the chat
 * template; the reply is `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`,
 * with `name` one of the tools and `arguments` valid for its `parameters`. */
#define QHX_GRAMMAR_TOOL_CALL 2          /* the reply is a tool call */
#define QHX_GRAMMAR_TOOL_CALL_OPTIONAL 3 /* a tool call or plain text (not starting with '<') */
#define QHX_GRAMMAR_LARK 4               /* qhx extension: a Lark or GBNF grammar */

typedef struct qhx_inputs {
    const char *text;               /* the user turn (or raw text with no_template) */
    const char *system_prompt;      /* NULL: none */
    const char *const *history;     /* earlier turns: user, assistant, user, ... */
    int32_t n_history;
    int32_t no_template;            /* 0: render the bundle's chat template */
    const char *image_path;         /* set: QHX_STATUS_UNSUPPORTED */
    const char *mask_path;          /* set: QHX_STATUS_UNSUPPORTED */
    const float *audio;             /* set: QHX_STATUS_UNSUPPORTED */
    int32_t n_audio;
    int32_t audio_sr;
} qhx_inputs;

typedef struct qhx_gen_cfg {
    int32_t max_new_tokens;         /* <= 0: until an end token or the context is full */
    float temperature;              /* <= 0: greedy */
    float top_p;                    /* >= 1 or <= 0: off */
    int32_t top_k;                  /* <= 0: off */
    float min_p;                    /* <= 0: off */
    float repetition_penalty;       /* over prompt and output; <= 0 or 1: off */
    int64_t seed;                   /* <= 0: random */
    const char *const *stop_strings;
    int32_t n_stop_strings;         /* 0: the bundle's own stop strings, if any */
    int32_t grammar_kind;           /* QHX_GRAMMAR_* */
    const char *grammar;
} qhx_gen_cfg;

typedef int (*qhx_should_cancel_cb)(void *user);

typedef struct qhx_generate_options {
    uint32_t struct_size;           /* sizeof(qhx_generate_options) as the caller knows it */
    int32_t disable_thinking;       /* close the reasoning block before the answer */
    qhx_should_cancel_cb should_cancel; /* polled between graph calls; nonzero stops */
    void *should_cancel_user;
    /* qhx extensions (read only when struct_size covers them; older callers get none).
     * speculation: qhx_generate's --spec words. NULL or "": none; "lookup" (prompt lookup);
     * "lookahead" (Jacobi guesses and an n-gram pool); "draft <bundle>" (a manifest or Genie
     * config with the same tokenizer, loaded onto the session's runtime at its first use
     * and kept while the session asks for it). Drafts are verified in one execute of the
     * bundle's multi-row graph: greedy output is unchanged, sampled output keeps its
     * distribution; a bundle with no such graph decodes plainly. */
    const char *speculation;
    int32_t draft_max;              /* <= 0: the default (8, and the verify rows less one) */
} qhx_generate_options;

/* Once per generated token with the text it completes (whole UTF-8 characters, possibly
 * none: len 0), then once with is_final != 0 and the text held back until the end (utf8
 * NULL when there is none). Everything passed adds up to qhx_output.text. Returning 0
 * stops the run (no further token calls; the call returns QHX_STATUS_CANCELLED). */
typedef int (*qhx_token_cb)(void *user, const char *utf8, int len, int token_id, int is_final);

typedef struct qhx_output {
    const char *text;               /* session-owned, NUL-terminated */
    int32_t n_prompt;
    int32_t n_generated;
    double prefill_ms;
    double decode_ms;
    const float *embedding;         /* not produced by text generation: NULL / 0 */
    int32_t n_embedding;
    const float *audio;
    int32_t n_audio;
    int32_t sample_rate;
    const uint8_t *image;
    int32_t img_w;
    int32_t img_h;
    int32_t img_c;
} qhx_output;

const char *qhx_version(void);
const char *qhx_status_str(qhx_status status);
const char *qhx_last_error(void);

qhx_runtime *qhx_runtime_create(const char *htp_lib, const char *system_lib);
void qhx_runtime_free(qhx_runtime *rt);
qhx_status qhx_runtime_device(const qhx_runtime *rt, char *arch, size_t arch_size,
                              int *soc_model, int *htp_device);

qhx_model *qhx_model_load(qhx_runtime *rt, const char *manifest_path,
                          const char *artifacts_dir);
void qhx_model_free(qhx_model *model);

qhx_session *qhx_session_create(qhx_model *model);
void qhx_session_free(qhx_session *session);
qhx_status qhx_session_reset(qhx_session *session);
qhx_status qhx_session_cancel(qhx_session *session);
const char *qhx_session_last_error(const qhx_session *session);

void qhx_gen_cfg_default(qhx_gen_cfg *cfg);
void qhx_generate_options_default(qhx_generate_options *options);

qhx_status qhx_generate(qhx_session *session, const qhx_inputs *inputs, const qhx_gen_cfg *cfg,
                        qhx_token_cb cb, void *user, qhx_output *out);
qhx_status qhx_generate_ex(qhx_session *session, const qhx_inputs *inputs,
                           const qhx_gen_cfg *cfg, const qhx_generate_options *options,
                           qhx_token_cb cb, void *user, qhx_output *out);

#ifdef __cplusplus
}
#endif

#endif /* QHEXRT_C_H */
