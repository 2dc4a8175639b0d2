/* Secrets never reach a dump: credential values on the command line and in environment
 * variables are replaced by "<redacted>" (the name stays: that it was set can matter).
 *
 * By name: the value of an option whose name has a credential word (--api-key=X, --token X,
 * --secretKey=X, name=X overrides alike).  Option names are split into words at '-', '_', '.'
 * and camelCase humps so that --max-tokens or --keep stay readable; environment names also
 * match on substrings, as wrappers and CI systems name them freely (HF_TOKEN, MY_DB_PASS).
 * By shape, anywhere in an argument or an environment value: the password of a URL
 * (scheme://user:pass@host), credential query parameters and name=value pairs
 * (?X-Amz-Signature=, &token=), header forms (Authorization: ..., Cookie: ...), a word after
 * "Bearer", and the token shapes of common services (the table `shapes` below). */
#include "og.h"
#include "strbuf.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#define REDACTED "<redacted>"

/* one word of an option name, lower case */
static bool secret_word(const char *w, size_t n)
{
    static const char *const exact[] = { "key",       "apikey",     "token",         "secret",     "password",
                                         "passwd",    "passphrase", "pass",          "pwd",        "pw",
                                         "passcode",  "auth",       "authorization", "credential", "credentials",
                                         "cred",      "creds",      "privatekey",    "accesskey",  "sessionkey",
                                         "secretkey", "authkey",    "signingkey",    "cookie",     "cookies",
                                         "jwt",       "bearer",     "signature",     "sig",        "sessionid" };
    char buf[64];
    if (n == 0 || n >= sizeof buf)
        return false;
    for (size_t i = 0; i < n; i++)
        buf[i] = (char)tolower((unsigned char)w[i]);
    buf[n] = 0;
    for (size_t i = 0; i < sizeof exact / sizeof *exact; i++)
        if (strcmp(buf, exact[i]) == 0)
            return true;
    /* glued forms: hftoken, authtoken, clientsecret, dbpassword, apikey */
    static const char *const suffix[] = { "token", "secret", "password", "passwd", "apikey" };
    for (size_t i = 0; i < sizeof suffix / sizeof *suffix; i++) {
        size_t m = strlen(suffix[i]);
        if (n > m && strcmp(buf + n - m, suffix[i]) == 0)
            return true;
    }
    return false;
}

/* a new word starts at name[j] inside a run of letters: secretKey, HFToken */
static bool hump(const char *name, size_t j, size_t n)
{
    unsigned char c = (unsigned char)name[j], prev = (unsigned char)name[j - 1];
    if (!isupper(c))
        return false;
    return islower(prev) || (isupper(prev) && j + 1 < n && islower((unsigned char)name[j + 1]));
}

bool og_secret_option(const char *name, size_t n)
{
    for (size_t i = 0; i < n;) {
        size_t j = i;
        while (j < n && isalnum((unsigned char)name[j]) && !(j > i && hump(name, j, n)))
            j++;
        if (secret_word(name + i, j - i))
            return true;
        i = j < n && !isalnum((unsigned char)name[j]) ? j + 1 : j;
    }
    return false;
}

bool og_secret_env_name(const char *name)
{
    static const char *const safe[] = { "NCCL_IB_PKEY" }; /* an InfiniBand partition index */
    for (size_t i = 0; i < sizeof safe / sizeof *safe; i++)
        if (strcmp(name, safe[i]) == 0)
            return false;
    static const char *const deny[] = { "PASS", "TOKEN", "SECRET", "AUTH", "CRED", "KEY", "PWD", "COOKIE" };
    for (size_t i = 0; i < sizeof deny / sizeof *deny; i++)
        if (strcasestr(name, deny[i]))
            return true;
    return og_secret_option(name, strlen(name)); /* DB_PW, GIT_JWT, URL_SIG */
}

typedef struct {
    char *p;
    size_t n, len;
} out_t;

static void put(out_t *o, const char *s, size_t n)
{
    for (size_t i = 0; i < n && o->len + 1 < o->n; i++)
        o->p[o->len++] = s[i] ? s[i] : ' ';
    o->p[o->len] = 0;
}

/* a copy cut short ends on a whole character */
static void finish(out_t *o)
{
    if (o->len + 1 >= o->n) {
        o->len = og_utf8_cut(o->p, o->len);
        o->p[o->len] = 0;
    }
}

static void put_redacted(out_t *o) { put(o, REDACTED, strlen(REDACTED)); }

/* ---------------------------------------------------------------- token shapes */

enum { ALNUM, UPPER_DIGIT, WORD, WORD_DASH }; /* [A-Za-z0-9] [A-Z0-9] [A-Za-z0-9_] [A-Za-z0-9_-] */

static bool in_class(int cls, unsigned char c)
{
    switch (cls) {
    case ALNUM:
        return isalnum(c);
    case UPPER_DIGIT:
        return isupper(c) || isdigit(c);
    case WORD:
        return isalnum(c) || c == '_';
    default:
        return isalnum(c) || c == '_' || c == '-';
    }
}

/* The tokens of common services, recognised by their prefix and body. */
static const struct shape {
    const char *prefix;
    int cls;
    size_t min, max; /* length of the body after the prefix */
} shapes[] = {
    { "sk-", WORD_DASH, 16, 400 }, /* OpenAI, Anthropic (sk-ant-...), sk-proj-... */
    { "hf_", ALNUM, 20, 200 },     /* Hugging Face */
    { "ghp_", ALNUM, 20, 200 },    /* GitHub: personal, OAuth, user, server, refresh */
    { "gho_", ALNUM, 20, 200 },       { "ghu_", ALNUM, 20, 200 },       { "ghs_", ALNUM, 20, 200 },
    { "ghr_", ALNUM, 20, 200 },       { "github_pat_", WORD, 20, 400 }, /* GitHub fine-grained */
    { "glpat-", WORD_DASH, 20, 200 },                                   /* GitLab */
    { "AKIA", UPPER_DIGIT, 16, 16 },                                    /* AWS access key ids (long-lived, temporary) */
    { "ASIA", UPPER_DIGIT, 16, 16 },  { "AIza", WORD_DASH, 35, 35 },    /* Google API keys */
    { "xoxa-", WORD_DASH, 8, 400 },                                     /* Slack */
    { "xoxb-", WORD_DASH, 8, 400 },   { "xoxp-", WORD_DASH, 8, 400 },   { "xoxr-", WORD_DASH, 8, 400 },
    { "xoxs-", WORD_DASH, 8, 400 },   { "xoxe-", WORD_DASH, 8, 400 },   { "npm_", ALNUM, 30, 100 }, /* npm */
    { "sk_live_", ALNUM, 16, 200 },                                                                 /* Stripe */
    { "rk_live_", ALNUM, 16, 200 },
};

static size_t run_of(const char *s, size_t n, int cls)
{
    size_t k = 0;
    while (k < n && in_class(cls, (unsigned char)s[k]))
        k++;
    return k;
}

/* length of a token at s (0: none); s starts at a word boundary */
static size_t token_at(const char *s, size_t n)
{
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        size_t m = strlen(shapes[i].prefix);
        if (n <= m || memcmp(s, shapes[i].prefix, m) != 0)
            continue;
        size_t body = run_of(s + m, n - m, shapes[i].cls);
        bool glued = m + body < n && isalnum((unsigned char)s[m + body]); /* AKIA + 17 characters */
        if (body >= shapes[i].min && body <= shapes[i].max && !glued)
            return m + body;
    }
    /* a JWT: three base64url parts, the first a JSON header ("eyJ" is base64 of '{"') */
    if (n > 3 && memcmp(s, "eyJ", 3) == 0) {
        size_t a = run_of(s, n, WORD_DASH);
        if (a >= 10 && a < n && s[a] == '.') {
            size_t b = run_of(s + a + 1, n - a - 1, WORD_DASH);
            size_t end = a + 1 + b;
            if (b >= 2 && end < n && s[end] == '.')
                return end + 1 + run_of(s + end + 1, n - end - 1, WORD_DASH);
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- free text */

static bool name_char(unsigned char c) { return isalnum(c) || c == '_' || c == '-' || c == '.'; }

static bool is_name(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!name_char((unsigned char)s[i]))
            return false;
    return n > 0;
}

/* may a name=value / name: value pair start after c? (not inside a path like /data/key=1) */
static bool pair_boundary(unsigned char c) { return strchr(" \t\n?&;,\"'{([=", c) != NULL; }

/* where a value ends: its delimiters (a URL's query, a list, a quoted string) */
static size_t value_end(const char *s, size_t n, size_t i)
{
    while (i < n && !strchr("&;,#\"' \t\n\r", s[i]))
        i++;
    return i;
}

/* Copies s[0..n) with every credential found by shape replaced (see the top of the file). */
static void put_text(out_t *o, const char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned char c = (unsigned char)s[i];
        bool boundary = i == 0 || !isalnum((unsigned char)s[i - 1]);
        size_t tok = boundary ? token_at(s + i, n - i) : 0;
        if (tok) {
            put_redacted(o);
            i += tok;
            continue;
        }
        /* scheme://user:pass@host: the password goes, the user and host stay */
        if (c == ':' && n - i >= 3 && s[i + 1] == '/' && s[i + 2] == '/') {
            size_t auth = i + 3, end = auth, at = 0;
            while (end < n && !strchr("/?#,; \t\n\"'", s[end]))
                end++;
            for (size_t k = auth; k < end; k++)
                if (s[k] == '@')
                    at = k; /* the last @ ends the user info */
            const char *colon = at ? memchr(s + auth, ':', at - auth) : NULL;
            if (colon) {
                put(o, s + i, (size_t)(colon + 1 - (s + i)));
                put_redacted(o);
                i = at;
            } else {
                put(o, s + i, 3);
                i = auth;
            }
            continue;
        }
        /* Bearer <credential> */
        if (boundary && n - i > 7 && strncasecmp(s + i, "bearer", 6) == 0 && (s[i + 6] == ' ' || s[i + 6] == '\t')) {
            size_t v = i + 6;
            while (v < n && (s[v] == ' ' || s[v] == '\t'))
                v++;
            put(o, s + i, v - i);
            if (v < n) {
                put_redacted(o);
                i = value_end(s, n, v);
            } else {
                i = v;
            }
            continue;
        }
        /* name=value, name:value and "Name: value" with a credential name */
        if (c == '=' || c == ':') {
            size_t b = i;
            while (b > 0 && name_char((unsigned char)s[b - 1]))
                b--;
            size_t d = b;
            while (d < i && s[d] == '-')
                d++;
            if (d < i && (b == 0 || pair_boundary((unsigned char)s[b - 1])) && og_secret_option(s + d, i - d)) {
                size_t v = i + 1;
                bool header = c == ':' && v < n && s[v] == ' ';
                while (header && v < n && s[v] == ' ')
                    v++;
                put(o, s + i, v - i);
                size_t end = v;
                while (header && end < n && s[end] != '\n' && s[end] != '\r')
                    end++; /* a header's value: the rest of its line */
                if (!header)
                    end = value_end(s, n, v);
                if (end > v)
                    put_redacted(o);
                i = end;
                continue;
            }
        }
        put(o, s + i, 1);
        i++;
    }
}

void og_redact_text(const char *in, char *out, size_t outsz)
{
    out_t o = { out, outsz, 0 };
    if (!outsz)
        return;
    out[0] = 0;
    put_text(&o, in, strlen(in));
    finish(&o);
}

void og_cmdline_join(const char *raw, size_t n, char *out, size_t outsz)
{
    out_t o = { out, outsz, 0 };
    if (!outsz)
        return;
    out[0] = 0;
    bool redact_next = false;
    for (size_t i = 0; i < n;) {
        const char *a = raw + i;
        size_t len = strnlen(a, n - i);
        if (i)
            put(&o, " ", 1);
        const char *eq = memchr(a, '=', len);
        size_t dashes = 0;
        while (dashes < len && a[dashes] == '-')
            dashes++;
        if (redact_next && !dashes) {
            put_redacted(&o);
            redact_next = false;
        } else if (eq && is_name(a + dashes, (size_t)(eq - a) - dashes) &&
                   og_secret_option(a + dashes, (size_t)(eq - a) - dashes)) {
            /* --api-key=X, api_key=X: all of the rest */
            put(&o, a, (size_t)(eq + 1 - a));
            put_redacted(&o);
            redact_next = false;
        } else {
            /* --token X: the next argument is the value */
            redact_next = dashes && dashes < len && !eq && og_secret_option(a + dashes, len - dashes);
            put_text(&o, a, len);
        }
        i += len + 1;
    }
    finish(&o);
}
