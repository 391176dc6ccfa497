/*
 * The C API as an app uses it (the SDK adapter's call order), against libqhx.a:
 *
 *   capi_test <htp_lib> <system_lib> <manifest_a> <expected_a_file> <manifest_b> <n_tokens> [basic]
 *
 * manifest_a has a chat template; expected_a_file holds the text `qhx_generate --chat
 * --json` printed for the prompt below with the same settings (greedy). manifest_b is a
 * second model, run as raw text (no_template). Prints one line per check to stderr and
 * exits 0 only if every check passed. "basic" (for the slow HTP simulator and bundles without
 * a chat template) runs the SDK's call order twice with model A as raw text (no_template;
 * the expected text then comes from the CLI without --chat) and skips the cancellation,
 * refusal and concurrency checks; model B then runs alone (raw text, twice).
 */
#define _DEFAULT_SOURCE /* usleep */
#include <qhexrt/qhexrt_c.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if UINTPTR_MAX == 0xffffffffffffffffu
/* The same numbers as capi/src/abi.rs's layout tests. */
#include <stddef.h>
_Static_assert(sizeof(qhx_inputs) == 64, "qhx_inputs");
_Static_assert(offsetof(qhx_inputs, no_template) == 28, "qhx_inputs.no_template");
_Static_assert(offsetof(qhx_inputs, audio_sr) == 60, "qhx_inputs.audio_sr");
_Static_assert(sizeof(qhx_gen_cfg) == 56, "qhx_gen_cfg");
_Static_assert(offsetof(qhx_gen_cfg, seed) == 24, "qhx_gen_cfg.seed");
_Static_assert(offsetof(qhx_gen_cfg, grammar_kind) == 44, "qhx_gen_cfg.grammar_kind");
_Static_assert(sizeof(qhx_generate_options) == 40, "qhx_generate_options");
_Static_assert(offsetof(qhx_generate_options, speculation) == 24, "options.speculation");
_Static_assert(offsetof(qhx_generate_options, draft_max) == 32, "options.draft_max");
_Static_assert(offsetof(qhx_generate_options, should_cancel) == 8, "options.should_cancel");
_Static_assert(sizeof(qhx_output) == 88, "qhx_output");
_Static_assert(offsetof(qhx_output, decode_ms) == 24, "qhx_output.decode_ms");
_Static_assert(offsetof(qhx_output, img_c) == 80, "qhx_output.img_c");
#endif

static int failures = 0;

#define CHECK(cond, ...)                                                          \
    do {                                                                          \
        if (cond) {                                                               \
            fprintf(stderr, "ok   ");                                             \
        } else {                                                                  \
            fprintf(stderr, "FAIL ");                                             \
            failures++;                                                           \
        }                                                                         \
        fprintf(stderr, __VA_ARGS__);                                             \
        fprintf(stderr, "\n");                                                    \
    } while (0)

static const char *PROMPT = "What is the capital of France?";

/* What the token callback saw. */
struct stream {
    char text[65536];
    size_t len;
    int token_calls;
    int final_calls;
    int calls_after_final;
    int stop_after; /* return 0 on this token call (0: never) */
    int calls_after_stop;
    int stopped;
};

static int on_token(void *user, const char *utf8, int len, int token_id, int is_final) {
    struct stream *s = user;
    if (s->final_calls > 0) s->calls_after_final++;
    if (s->stopped && !is_final) s->calls_after_stop++;
    if (len > 0 && utf8 && s->len + (size_t)len < sizeof s->text) {
        memcpy(s->text + s->len, utf8, (size_t)len);
        s->len += (size_t)len;
        s->text[s->len] = 0;
    }
    if (is_final) {
        s->final_calls++;
        return 1;
    }
    (void)token_id;
    s->token_calls++;
    if (s->stop_after && s->token_calls == s->stop_after) {
        s->stopped = 1;
        return 0;
    }
    return 1;
}

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    static char buf[65536];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return buf;
}

static int n_tokens = 16;

static qhx_status run(qhx_session *s, const char *text, int no_template,
                      const qhx_generate_options *opt, struct stream *st, qhx_output *out) {
    qhx_inputs in;
    memset(&in, 0, sizeof in);
    in.text = text;
    in.no_template = no_template;
    qhx_gen_cfg cfg;
    qhx_gen_cfg_default(&cfg);
    cfg.max_new_tokens = n_tokens;
    memset(st, 0, sizeof *st);
    return qhx_generate_ex(s, &in, &cfg, opt, on_token, st, out);
}

/* should_cancel, raised by another thread once the request has started polling. */
struct cancel_state {
    atomic_int polls;
    atomic_int raise;
};

static int should_cancel(void *user) {
    struct cancel_state *c = user;
    atomic_fetch_add(&c->polls, 1);
    return atomic_load(&c->raise);
}

static void *raiser(void *user) {
    struct cancel_state *c = user;
    while (atomic_load(&c->polls) < 1) usleep(200);
    atomic_store(&c->raise, 1);
    return NULL;
}

struct job {
    qhx_session *s;
    const char *text;
    int no_template;
    struct stream st;
    qhx_output out;
    qhx_status status;
    char result[65536];
};

static void *job_run(void *user) {
    struct job *j = user;
    j->status = run(j->s, j->text, j->no_template, NULL, &j->st, &j->out);
    snprintf(j->result, sizeof j->result, "%s", j->out.text ? j->out.text : "");
    return NULL;
}

/* A generation that holds its session: the first token call says so, then waits for release. */
struct hold {
    qhx_session *s;
    atomic_int entered;
    atomic_int release;
    qhx_status status;
};

static int hold_token(void *user, const char *utf8, int len, int token_id, int is_final) {
    struct hold *h = user;
    (void)utf8, (void)len, (void)token_id;
    if (!is_final && !atomic_load(&h->entered)) {
        atomic_store(&h->entered, 1);
        while (!atomic_load(&h->release)) usleep(200);
    }
    return 1;
}

static void *hold_run(void *user) {
    struct hold *h = user;
    qhx_inputs in;
    memset(&in, 0, sizeof in);
    in.text = PROMPT;
    qhx_gen_cfg cfg;
    qhx_gen_cfg_default(&cfg);
    cfg.max_new_tokens = 4;
    qhx_output out;
    h->status = qhx_generate_ex(h->s, &in, &cfg, NULL, hold_token, h, &out);
    if (!atomic_load(&h->entered)) atomic_store(&h->entered, 1); /* never block the test */
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 7 && !(argc == 8 && strcmp(argv[7], "basic") == 0)) {
        fprintf(stderr, "usage: capi_test <htp_lib> <system_lib> <manifest_a> <expected_a_file> "
                        "<manifest_b> <n_tokens> [basic]\n");
        return 2;
    }
    int full = argc == 7;
    int a_raw = !full;
    const char *htp = argv[1], *sys = argv[2], *ma = argv[3], *mb = argv[5];
    n_tokens = atoi(argv[6]);
    const char *expected = read_file(argv[4]);
    if (!expected) {
        fprintf(stderr, "capi_test: cannot read %s\n", argv[4]);
        return 2;
    }
    char want_a[65536];
    snprintf(want_a, sizeof want_a, "%s", expected);

    CHECK(QHX_ABI_VERSION_MAJOR == 1, "ABI major 1");
    CHECK(strncmp(qhx_version(), "qhx/", 4) == 0, "qhx_version: %s", qhx_version());
    CHECK(strcmp(qhx_status_str(QHX_STATUS_HOST_OP_FAILED), "HostOpFailed") == 0,
          "qhx_status_str(HOST_OP_FAILED) = %s", qhx_status_str(QHX_STATUS_HOST_OP_FAILED));

    /* The SDK's order, twice in one process. */
    for (int round = 0; round < 2; round++) {
        qhx_runtime *rt = qhx_runtime_create(htp, sys);
        CHECK(rt != NULL, "round %d: runtime created (%s)", round, rt ? "" : qhx_last_error());
        if (!rt) return 1;
        qhx_runtime *rt2 = qhx_runtime_create(htp, sys);
        CHECK(rt2 == NULL && strstr(qhx_last_error(), "already exists"),
              "round %d: a second runtime is refused: %s", round, qhx_last_error());
        char arch[16] = {0};
        int soc = -1, dev = -1;
        CHECK(qhx_runtime_device(rt, arch, sizeof arch, &soc, &dev) == QHX_STATUS_OK &&
                  arch[0] == 'v' && soc > 0 && dev == 0,
              "round %d: device arch %s soc %d htp_device %d", round, arch, soc, dev);
        CHECK(qhx_runtime_device(rt, NULL, 0, NULL, NULL) == QHX_STATUS_OK,
              "round %d: device with NULL outputs", round);

        qhx_model *bad = qhx_model_load(rt, "/nonexistent/manifest.json", NULL);
        CHECK(bad == NULL && strlen(qhx_last_error()) > 0,
              "round %d: a missing manifest fails: %s", round, qhx_last_error());

        qhx_model *a = qhx_model_load(rt, ma, NULL);
        CHECK(a != NULL, "round %d: model A loaded %s", round, a ? "" : qhx_last_error());
        if (!a) return 1;
        qhx_session *sa = qhx_session_create(a);
        CHECK(sa != NULL, "round %d: session A", round);
        CHECK(qhx_session_reset(sa) == QHX_STATUS_OK, "round %d: reset", round);

        qhx_generate_options opt;
        qhx_generate_options_default(&opt);
        CHECK(opt.struct_size == sizeof opt, "round %d: options struct_size %u", round,
              opt.struct_size);

        static struct stream st;
        qhx_output out;
        qhx_status rc = run(sa, PROMPT, a_raw, &opt, &st, &out);
        CHECK(rc == QHX_STATUS_OK, "round %d: generate_ex -> %s %s", round, qhx_status_str(rc),
              rc ? qhx_session_last_error(sa) : "");
        CHECK(out.text && strcmp(st.text, out.text) == 0, "round %d: streamed text = out.text",
              round);
        CHECK(out.text && strcmp(out.text, want_a) == 0,
              "round %d: out.text = the CLI's --json text: \"%s\" vs \"%s\"", round,
              out.text ? out.text : "(null)", want_a);
        CHECK(st.token_calls == out.n_generated && st.final_calls == 1 &&
                  st.calls_after_final == 0,
              "round %d: %d token calls for %d tokens, %d final call(s)", round, st.token_calls,
              out.n_generated, st.final_calls);
        CHECK(out.n_prompt > 0 && out.decode_ms >= 0 && out.embedding == NULL && out.image == NULL,
              "round %d: n_prompt %d prefill %.1f ms decode %.1f ms", round, out.n_prompt,
              out.prefill_ms, out.decode_ms);

        if (round == 0 && full) {
            /* should_cancel raised from another thread mid-prefill. */
            char long_prompt[8192] = "";
            for (int i = 0; i < 40; i++)
                strcat(long_prompt, "The quick brown fox jumps over the lazy dog. ");
            struct cancel_state cs;
            atomic_init(&cs.polls, 0);
            atomic_init(&cs.raise, 0);
            opt.should_cancel = should_cancel;
            opt.should_cancel_user = &cs;
            pthread_t t;
            pthread_create(&t, NULL, raiser, &cs);
            rc = run(sa, long_prompt, 0, &opt, &st, &out);
            pthread_join(t, NULL);
            CHECK(rc == QHX_STATUS_CANCELLED && out.n_generated == 0 && st.token_calls == 0 &&
                      st.final_calls == 1,
                  "cancel mid-prefill -> %s, %d generated, %d polls, %d token calls",
                  qhx_status_str(rc), out.n_generated, atomic_load(&cs.polls), st.token_calls);
            qhx_generate_options_default(&opt);
            rc = run(sa, PROMPT, 0, &opt, &st, &out);
            CHECK(rc == QHX_STATUS_OK && out.text && strcmp(out.text, want_a) == 0,
                  "after the cancel the same request gives the same text");

            /* Speculation (qhx extension): every mode gives the plain text; model A drafts
             * for itself in "draft" mode (the same tokenizer, so every draft is kept). */
            char draft_words[4200];
            snprintf(draft_words, sizeof draft_words, "draft %s", ma);
            const char *modes[] = {"lookup", "lookahead", draft_words};
            for (int k = 0; k < 3; k++) {
                opt.speculation = modes[k];
                opt.draft_max = k == 2 ? 4 : 0;
                rc = run(sa, PROMPT, 0, &opt, &st, &out);
                CHECK(rc == QHX_STATUS_OK && out.text && strcmp(out.text, want_a) == 0,
                      "speculation \"%.12s\" -> %s, the plain text: \"%s\" %s", modes[k],
                      qhx_status_str(rc), out.text ? out.text : "(null)",
                      rc ? qhx_session_last_error(sa) : "");
            }
            opt.speculation = "jacobi";
            rc = run(sa, PROMPT, 0, &opt, &st, &out);
            CHECK(rc == QHX_STATUS_INVALID_ARGUMENT &&
                      strstr(qhx_session_last_error(sa), "options.speculation"),
                  "speculation \"jacobi\" -> %s: %s", qhx_status_str(rc),
                  qhx_session_last_error(sa));
            opt.speculation = "draft /nonexistent/draft.json";
            rc = run(sa, PROMPT, 0, &opt, &st, &out);
            CHECK(rc != QHX_STATUS_OK && strstr(qhx_session_last_error(sa), "/nonexistent/draft.json"),
                  "a missing draft bundle -> %s: %s", qhx_status_str(rc),
                  qhx_session_last_error(sa));
            /* A caller built against the 1.0 struct (24 bytes) never has it read. */
            opt.speculation = "jacobi";
            opt.struct_size = 24;
            rc = run(sa, PROMPT, 0, &opt, &st, &out);
            CHECK(rc == QHX_STATUS_OK && strcmp(out.text, want_a) == 0,
                  "a 24-byte options struct ignores speculation -> %s", qhx_status_str(rc));
            qhx_generate_options_default(&opt);

            /* A callback returning 0 gets no further token calls. */
            memset(&st, 0, sizeof st);
            st.stop_after = 3;
            qhx_inputs in;
            memset(&in, 0, sizeof in);
            in.text = PROMPT;
            qhx_gen_cfg cfg;
            qhx_gen_cfg_default(&cfg);
            cfg.max_new_tokens = n_tokens;
            rc = qhx_generate_ex(sa, &in, &cfg, &opt, on_token, &st, &out);
            CHECK(rc == QHX_STATUS_CANCELLED && st.token_calls == 3 && st.calls_after_stop == 0 &&
                      st.final_calls == 1 && out.n_generated == 3 &&
                      strcmp(out.text, st.text) == 0 && strncmp(want_a, out.text, strlen(out.text)) == 0,
                  "callback 0 on token 3 -> %s, %d token calls, %d generated, text \"%s\"",
                  qhx_status_str(rc), st.token_calls, out.n_generated, out.text);

            /* Refusals are statuses with a message, per session. */
            in.image_path = "/tmp/cat.png";
            rc = qhx_generate_ex(sa, &in, &cfg, &opt, on_token, &st, &out);
            CHECK(rc == QHX_STATUS_UNSUPPORTED && strstr(qhx_session_last_error(sa), "image"),
                  "an image input -> %s: %s", qhx_status_str(rc), qhx_session_last_error(sa));
            in.image_path = NULL;
            cfg.grammar_kind = QHX_GRAMMAR_TOOL_CALL;
            cfg.grammar = "toolcall:[{\"type\": \"function\", \"function\": {\"name\": "
                          "\"get_weather\", \"parameters\": {\"type\": \"object\", "
                          "\"properties\": {\"city\": {\"type\": \"string\", \"maxLength\": 20}}, "
                          "\"required\": [\"city\"]}}}]";
            cfg.max_new_tokens = 40;
            in.text = "What's the weather like in Paris?";
            rc = qhx_generate_ex(sa, &in, &cfg, &opt, on_token, &st, &out);
            CHECK(rc == QHX_STATUS_OK &&
                      strncmp(out.text,
                              "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"",
                              59) == 0 &&
                      strstr(out.text, "}}\n</tool_call>") != NULL,
                  "grammar_kind 2 -> %s: %s", qhx_status_str(rc), out.text);
            cfg.grammar = "toolcall:[]";
            rc = qhx_generate_ex(sa, &in, &cfg, &opt, on_token, &st, &out);
            CHECK(rc == QHX_STATUS_GRAMMAR, "an empty tool list -> %s: %s", qhx_status_str(rc),
                  qhx_session_last_error(sa));
            in.text = PROMPT;
            cfg.grammar_kind = QHX_GRAMMAR_JSON;
            cfg.grammar = "{\"type\":\"object\",\"properties\":{\"capital\":{\"type\":\"string\"}},"
                          "\"required\":[\"capital\"]}";
            cfg.max_new_tokens = 24;
            rc = qhx_generate_ex(sa, &in, &cfg, &opt, on_token, &st, &out);
            CHECK(rc == QHX_STATUS_OK && out.text[0] == '{' && strstr(out.text, "\"capital\""),
                  "grammar_kind 1 -> %s: %s", qhx_status_str(rc), out.text);
            cfg.grammar = "{\"type\": ";
            rc = qhx_generate_ex(sa, &in, &cfg, &opt, on_token, &st, &out);
            CHECK(rc == QHX_STATUS_GRAMMAR, "a broken schema -> %s: %s", qhx_status_str(rc),
                  qhx_session_last_error(sa));
            cfg.grammar_kind = 0;
            opt.struct_size = 2;
            rc = qhx_generate_ex(sa, &in, &cfg, &opt, on_token, &st, &out);
            CHECK(rc == QHX_STATUS_INVALID_ARGUMENT, "struct_size 2 -> %s: %s",
                  qhx_status_str(rc), qhx_session_last_error(sa));
            /* An older, shorter options struct: only struct_size and disable_thinking. A size
             * ending inside should_cancel (here set to a garbage pointer) leaves it unread. */
            opt.struct_size = 8;
            rc = run(sa, PROMPT, 0, &opt, &st, &out);
            CHECK(rc == QHX_STATUS_OK && strcmp(out.text, want_a) == 0,
                  "struct_size 8 reads the prefix only");
            opt.struct_size = 12;
            opt.should_cancel = (qhx_should_cancel_cb)(uintptr_t)0x1;
            rc = run(sa, PROMPT, 0, &opt, &st, &out);
            CHECK(rc == QHX_STATUS_OK && strcmp(out.text, want_a) == 0,
                  "struct_size 12 does not read half of should_cancel");
            qhx_generate_options_default(&opt);
            CHECK(qhx_generate_ex(NULL, &in, &cfg, &opt, on_token, &st, &out) ==
                      QHX_STATUS_INVALID_ARGUMENT,
                  "a NULL session -> InvalidArgument");

            /* A call refused BUSY (another thread holds the session) reports to its own
             * thread only: the owner's message, and the very string handed out for it, stay
             * (under ASan a freed string read here is an error of its own). */
            in.image_path = "/tmp/cat.png";
            rc = qhx_generate_ex(sa, &in, &cfg, &opt, on_token, &st, &out);
            in.image_path = NULL;
            const char *owner_err = qhx_session_last_error(sa);
            char owner_copy[1024];
            snprintf(owner_copy, sizeof owner_copy, "%s", owner_err);
            static struct hold h;
            h.s = sa;
            atomic_init(&h.entered, 0);
            atomic_init(&h.release, 0);
            pthread_t th;
            pthread_create(&th, NULL, hold_run, &h);
            while (!atomic_load(&h.entered)) usleep(200);
            qhx_status busy = qhx_session_reset(sa);
            char thread_err[1024];
            snprintf(thread_err, sizeof thread_err, "%s", qhx_last_error());
            int same_text = strcmp(qhx_session_last_error(sa), owner_copy) == 0;
            int same_string = strcmp(owner_err, owner_copy) == 0;
            atomic_store(&h.release, 1);
            pthread_join(th, NULL);
            CHECK(rc == QHX_STATUS_UNSUPPORTED && busy == QHX_STATUS_BUSY &&
                      strstr(thread_err, "in use by another thread") && same_text && same_string &&
                      h.status == QHX_STATUS_OK,
                  "reset while another thread generates -> %s (\"%s\"); the owner's error "
                  "\"%s\" kept: text %d, string %d; the owner's run -> %s",
                  qhx_status_str(busy), thread_err, owner_copy, same_text, same_string,
                  qhx_status_str(h.status));

            /* Two sessions of two models generate at once. */
            qhx_model *b = qhx_model_load(rt, mb, NULL);
            CHECK(b != NULL, "model B loaded %s", b ? "" : qhx_last_error());
            if (!b) return 1;
            qhx_session *sb = qhx_session_create(b);
            static struct job ja, jb;
            ja.s = sa; ja.text = PROMPT; ja.no_template = 0;
            jb.s = sb; jb.text = "Once upon a time"; jb.no_template = 1;
            job_run(&jb); /* B alone: the reference */
            char want_b[65536];
            snprintf(want_b, sizeof want_b, "%s", jb.result);
            CHECK(jb.status == QHX_STATUS_OK && strlen(want_b) > 0, "model B alone: \"%s\"",
                  want_b);
            pthread_t ta, tb;
            pthread_create(&ta, NULL, job_run, &ja);
            pthread_create(&tb, NULL, job_run, &jb);
            pthread_join(ta, NULL);
            pthread_join(tb, NULL);
            CHECK(ja.status == QHX_STATUS_OK && strcmp(ja.result, want_a) == 0,
                  "concurrent A = A alone");
            CHECK(jb.status == QHX_STATUS_OK && strcmp(jb.result, want_b) == 0,
                  "concurrent B = B alone");
            qhx_session_free(sb);
            /* Freed out of order: the model outlives its handle while a session holds it. */
            qhx_model_free(b);
        }
        if (round == 0 && !full) {
            /* Model B (e.g. a Genie config) as raw text: the same text twice, as streamed. */
            qhx_model *b = qhx_model_load(rt, mb, NULL);
            CHECK(b != NULL, "model B loaded %s", b ? "" : qhx_last_error());
            if (!b) return 1;
            qhx_session *sb = qhx_session_create(b);
            static struct job jb;
            jb.s = sb; jb.text = "Once upon a time"; jb.no_template = 1;
            job_run(&jb);
            char first[65536];
            snprintf(first, sizeof first, "%s", jb.result);
            int streamed = strcmp(jb.st.text, jb.result) == 0;
            job_run(&jb);
            CHECK(jb.status == QHX_STATUS_OK && streamed && strlen(first) > 0 &&
                      strcmp(first, jb.result) == 0,
                  "model B: \"%s\" twice, as streamed", first);
            qhx_session_free(sb);
            qhx_model_free(b);
        }
        /* The runtime handle first: the model keeps it alive until it goes too. */
        qhx_runtime_free(rt);
        qhx_model_free(a);
        qhx_session_free(sa);
    }
    fprintf(stderr, "capi_test: %s (%d failed)\n", failures ? "FAILED" : "all passed", failures);
    return failures ? 1 : 0;
}
