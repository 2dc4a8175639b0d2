/* What a dump may show of the command line and the environment (shim/redact.c): credential
 * values are replaced by "<redacted>", everything else is kept as it was. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "og.h"

/* argv given as one string with '|' between the arguments */
static void joined(const char *argv, const char *want)
{
    char raw[1024], out[1024];
    size_t n = strlen(argv) + 1;
    memcpy(raw, argv, n);
    for (size_t i = 0; i < n; i++)
        if (raw[i] == '|')
            raw[i] = 0;
    og_cmdline_join(raw, n, out, sizeof out);
    assert_string_equal(out, want);
}

static void cmdline(void **state)
{
    joined("python|train.py|--lr|0.1", "python train.py --lr 0.1");
    joined("train|--api-key=abc123", "train --api-key=<redacted>");
    joined("train|--token|abc123|--epochs|3", "train --token <redacted> --epochs 3");
    joined("train|--password=hunter2", "train --password=<redacted>");
    joined("train|-p|8080|--db-password|x|--hf_token=y",
           "train -p 8080 --db-password <redacted> --hf_token=<redacted>");
    joined("train|--client-secret=s|--AUTH-TOKEN=t|--apikey|k",
           "train --client-secret=<redacted> --AUTH-TOKEN=<redacted> --apikey <redacted>");
    joined("train|wandb.api_key=z|lr=3", "train wandb.api_key=<redacted> lr=3");
    joined("git|clone|https://bob:pa55@example.com/r.git", "git clone https://bob:<redacted>@example.com/r.git");
    joined("x|--url=postgres://u:p@db:5432/x,redis://:q@h/0",
           "x --url=postgres://u:<redacted>@db:5432/x,redis://:<redacted>@h/0");
    joined("x|https://example.com/a@b|http://user@host/", "x https://example.com/a@b http://user@host/");
    /* not credentials: plural tokens, a tokenizer, a file path with key in a directory name */
    joined("gen|--max-tokens|77|--tokenizer|gpt2|--keep|1", "gen --max-tokens 77 --tokenizer gpt2 --keep 1");
    joined("x|--token", "x --token"); /* no value: nothing to hide */
    joined("x|--token|--verbose", "x --token --verbose");
    joined("x|/data/key=1/file", "x /data/key=1/file");
}

/* the program an argv runs (capture.c: which other processes run this program with another command line) */
static void program(const char *argv, const char *want)
{
    char raw[1024], out[256];
    size_t n = strlen(argv) + 1;
    memcpy(raw, argv, n);
    for (size_t i = 0; i < n; i++)
        if (raw[i] == '|')
            raw[i] = 0;
    og_program_of(raw, n, out, sizeof out);
    assert_string_equal(out, want);
}

static void program_of_argv(void **state)
{
    program("/usr/bin/python3.11|-u|serve.py|--port|8001", "python serve.py");
    program("python3|/srv/serve.py|--model|m", "python /srv/serve.py");
    program("python|-W|ignore|-m|vllm.entrypoints.openai.api_server|--port|8000",
            "python -m vllm.entrypoints.openai.api_server");
    program("python3|-c|import x", "python -c");
    program("/opt/venv/bin/vllm|serve|/srv/models/a", "vllm");
    program("python3", "python");
    char out[8] = "x";
    og_program_of("", 0, out, sizeof out);
    assert_string_equal(out, "");
    /* the same script and arguments through another path to the interpreter (sys.executable) */
    static const char a[] = "python3\0/w/train.py\0--devices=4", b[] = "/usr/bin/python3\0/w/train.py\0--devices=4",
                      c[] = "/usr/bin/python3\0/w/train.py\0--devices=2", d[] = "python3";
    assert_true(og_same_arguments(a, sizeof a, b, sizeof b));
    assert_false(og_same_arguments(a, sizeof a, c, sizeof c));
    assert_false(og_same_arguments(a, sizeof a, d, sizeof d));
    assert_true(og_same_arguments(d, sizeof d - 1, d, sizeof d - 1));
}

static void truncated(void **state)
{
    char out[16];
    const char raw[] = "train\0--api-key=abcdefghijkl";
    og_cmdline_join(raw, sizeof raw, out, sizeof out);
    assert_int_equal(strlen(out), sizeof out - 1);
    assert_null(strstr(out, "abc"));
    og_cmdline_join(raw, 0, out, sizeof out);
    assert_string_equal(out, "");
}

static void env_names(void **state)
{
    const char *secret
        [] = { "NCCL_AUTH_TOKEN",  "CUDA_PASSPHRASE", "TF_API_KEY", "XLA_CREDS",
               "PYTORCH_SECRET",   "JAX_DB_PASSWORD", "CUDA_PWD",   "hf_token",
               "OOMGUARD_KEYRING", "NCCL_SMTPPASS" /* PASS glued to another word: only the substring list sees it */ };
    const char *fine[] = { "CUDA_VISIBLE_DEVICES",
                           "PYTORCH_CUDA_ALLOC_CONF",
                           "NCCL_IB_PKEY",
                           "XLA_FLAGS",
                           "TF_GPU_ALLOCATOR",
                           "RANK",
                           "NCCL_DEBUG" };
    for (size_t i = 0; i < sizeof secret / sizeof *secret; i++)
        if (!og_secret_env_name(secret[i]))
            fail_msg("%s should be redacted", secret[i]);
    for (size_t i = 0; i < sizeof fine / sizeof *fine; i++)
        if (og_secret_env_name(fine[i]))
            fail_msg("%s should be shown", fine[i]);
}

/* The table of forms (tests/unit/redaction_forms.tsv), each through the functions a dump uses. */
static void forms(void **state)
{
    const char *path = getenv("OG_REDACTION_FORMS") ? getenv("OG_REDACTION_FORMS") : "tests/unit/redaction_forms.tsv";
    FILE *f = fopen(path, "r");
    if (!f)
        fail_msg("cannot open %s (run from the repository root)", path);
    char line[2048];
    int n = 0, bad = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        if (line[0] == '#' || !line[0])
            continue;
        char *in = strchr(line, '\t'), *want = in ? strchr(in + 1, '\t') : NULL;
        if (!in || !want)
            fail_msg("malformed line: %s", line);
        *in++ = 0;
        *want++ = 0;
        char out[1024];
        n++;
        if (!strcmp(line, "arg")) {
            char raw[1024];
            size_t len = strlen(in) + 1;
            memcpy(raw, in, len);
            for (size_t i = 0; i < len; i++)
                if (raw[i] == '|')
                    raw[i] = 0;
            og_cmdline_join(raw, len, out, sizeof out);
        } else {
            if (!og_env_entry(in, out, sizeof out))
                strcpy(out, "-");
        }
        if (strcmp(out, want) != 0) {
            print_error("form %d (%s %s):\n   got %s\n  want %s\n", n, line, in, out, want);
            bad++;
        }
    }
    fclose(f);
    print_message("%d forms, %d as expected\n", n, n - bad);
    assert_true(n >= 29);
    assert_int_equal(bad, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(cmdline),   cmocka_unit_test(program_of_argv), cmocka_unit_test(truncated),
        cmocka_unit_test(env_names), cmocka_unit_test(forms),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
