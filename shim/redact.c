/* Secrets never reach a dump: credential values on the command line and in environment
 * variables are replaced by "<redacted>" (the name stays: that it was set can matter).
 *
 * Command line: the value of an option whose name has a credential word (--api-key=X,
 * --token X, --password=X, name=X overrides alike) and the password of a URL
 * (scheme://user:pass@host).  Option names are split into words so that --max-tokens or
 * --keep stay readable; environment names match on substrings, as wrappers and CI systems
 * name them freely (HF_TOKEN, NCCL_AUTH_KEY_FILE, MY_DB_PASS). */
#include "og.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#define REDACTED "<redacted>"

/* one word of an option name, lower case */
static bool secret_word(const char *w, size_t n)
{
    static const char *const exact[] = {"key", "apikey", "token", "secret", "password", "passwd", "passphrase",
                                        "pass", "pwd", "auth", "credential", "credentials", "cred", "creds",
                                        "privatekey", "accesskey", "sessionkey"};
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
    static const char *const suffix[] = {"token", "secret", "password", "passwd", "apikey"};
    for (size_t i = 0; i < sizeof suffix / sizeof *suffix; i++) {
        size_t m = strlen(suffix[i]);
        if (n > m && strcmp(buf + n - m, suffix[i]) == 0)
            return true;
    }
    return false;
}

bool og_secret_option(const char *name, size_t n)
{
    for (size_t i = 0; i < n;) {
        size_t j = i;
        while (j < n && isalnum((unsigned char)name[j]))
            j++;
        if (secret_word(name + i, j - i))
            return true;
        i = j + 1;
    }
    return false;
}

bool og_secret_env_name(const char *name)
{
    static const char *const safe[] = {"NCCL_IB_PKEY"};   /* an InfiniBand partition index */
    for (size_t i = 0; i < sizeof safe / sizeof *safe; i++)
        if (strcmp(name, safe[i]) == 0)
            return false;
    static const char *const deny[] = {"PASS", "TOKEN", "SECRET", "AUTH", "CRED", "KEY", "PWD"};
    for (size_t i = 0; i < sizeof deny / sizeof *deny; i++)
        if (strcasestr(name, deny[i]))
            return true;
    return false;
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

/* One argument, with any URL passwords in it redacted. */
static void put_arg(out_t *o, const char *a, size_t n)
{
    size_t i = 0;
    while (i < n) {
        const char *sep = memmem(a + i, n - i, "://", 3);
        if (!sep) {
            put(o, a + i, n - i);
            return;
        }
        size_t auth = (size_t)(sep - a) + 3;               /* start of user:pass@host */
        size_t end = auth;
        while (end < n && a[end] != '/' && a[end] != ' ' && a[end] != ',' && a[end] != ';')
            end++;
        const char *at = NULL;
        for (size_t k = auth; k < end; k++)
            if (a[k] == '@')
                at = a + k;                                /* the last @ ends the user info */
        const char *colon = at ? memchr(a + auth, ':', (size_t)(at - (a + auth))) : NULL;
        if (colon) {
            put(o, a + i, (size_t)(colon + 1 - (a + i)));
            put(o, REDACTED, strlen(REDACTED));
            i = (size_t)(at - a);
        } else {
            put(o, a + i, end - i);
            i = end;
        }
    }
}

void og_cmdline_join(const char *raw, size_t n, char *out, size_t outsz)
{
    out_t o = {out, outsz, 0};
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
            put(&o, REDACTED, strlen(REDACTED));
            redact_next = false;
        } else if (eq && og_secret_option(a + dashes, (size_t)(eq - a) - dashes) && !memchr(a, '/', (size_t)(eq - a))) {
            /* --api-key=X, api_key=X */
            put(&o, a, (size_t)(eq + 1 - a));
            put(&o, REDACTED, strlen(REDACTED));
            redact_next = false;
        } else {
            /* --token X: the next argument is the value */
            redact_next = dashes && dashes < len && !eq && og_secret_option(a + dashes, len - dashes);
            put_arg(&o, a, len);
        }
        i += len + 1;
    }
}
