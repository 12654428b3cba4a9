"""Invented credentials for the redaction tests: every shape the rules know, near misses, key blocks.

Every token is made at run time from a seeded generator, so this file holds no real-looking
secret literal (the release check scans for them). test_credentials.py checks each shape
alone; test_redactor.py builds its documents from these tables.
"""

from __future__ import annotations

import random
import string

_RNG = random.Random(20240611)
UPPER_DIGITS = string.ascii_uppercase + string.digits
ALNUM = string.ascii_letters + string.digits
URLSAFE = ALNUM + "_-"
B64 = ALNUM + "/+"


def tok(n: int, alphabet: str = ALNUM) -> str:
    """A random string with at least one digit, upper and lower letter when the alphabet allows."""
    wants = [kind for kind in (str.isdigit, str.isalpha) if any(kind(c) for c in alphabet)]
    while True:
        s = "".join(_RNG.choice(alphabet) for _ in range(n))
        if all(any(kind(c) for c in s) for kind in wants):
            return s


def m(kind: str) -> str:
    return f"[REDACTED:{kind}]"


JWT = "eyJ" + tok(30, URLSAFE) + "." + "eyJ" + tok(40, URLSAFE) + "." + tok(43, URLSAFE)

# (id, before, secret, after, kind): text = before + secret + after, and the redacted text must be
# exactly before + marker + after.
POSITIVES = [
    ("aws-akia", "key id: ", "AKIA" + tok(16, UPPER_DIGITS), " (prod)", "aws-access-key"),
    ("aws-asia", "export AWS_ACCESS_KEY_ID=", "ASIA" + tok(16, UPPER_DIGITS), "\n", "aws-access-key"),
    ("aws-abia", "[", "ABIA" + tok(16, UPPER_DIGITS), "]", "aws-access-key"),
    ("aws-acca", "id ", "ACCA" + tok(16, UPPER_DIGITS), ".", "aws-access-key"),
    ("aws-secret-ini", "aws_secret_access_key = ", tok(40, B64), "\n", "aws-secret-key"),
    ("aws-secret-env", "AWS_SECRET_ACCESS_KEY=", tok(40, B64), " ./deploy", "aws-secret-key"),
    ("aws-secret-json", '"SecretAccessKey": "', tok(40, B64), '",', "aws-secret-key"),
    ("aws-secret-prose", "the aws secret: ", tok(40, B64), " was rotated", "aws-secret-key"),
    ("github-ghp", "token ", "ghp_" + tok(36), " here", "github-token"),
    ("github-gho", "", "gho_" + tok(36), "", "github-token"),
    ("github-ghu", "use `", "ghu_" + tok(40), "`", "github-token"),
    ("github-ghs", "GH=", "ghs_" + tok(36), ";", "github-token"),
    ("github-ghr", "(", "ghr_" + tok(36), ")", "github-token"),
    ("github-pat", "pat: ", "github_pat_" + tok(22) + "_" + tok(59), " end", "github-token"),
    ("github-all-same", "x ", "ghp_" + "A" * 36, " y", "github-token"),
    ("openai-legacy", "key ", "sk-" + tok(48), " ok", "openai-key"),
    ("openai-proj", "OPENAI_API_KEY=", "sk-proj-" + tok(60, URLSAFE), "\n", "openai-key"),
    ("openai-svcacct", "", "sk-svcacct-" + tok(50, URLSAFE), " (svc)", "openai-key"),
    ("openai-admin", "admin: `", "sk-admin-" + tok(50, URLSAFE), "`", "openai-key"),
    ("anthropic-api", "claude ", "sk-ant-api03-" + tok(93, URLSAFE) + "AA", " done", "anthropic-key"),
    ("anthropic-admin", "", "sk-ant-admin01-" + tok(60, URLSAFE), "", "anthropic-key"),
    ("slack-bot", "bot ", "xoxb-" + tok(12, string.digits) + "-" + tok(24), " x", "slack-token"),
    ("slack-user", "", "xoxp-" + tok(12, string.digits) + "-" + tok(32), "\n", "slack-token"),
    ("slack-app", "app=", "xapp-1-" + tok(11, UPPER_DIGITS) + "-" + tok(40), "", "slack-token"),
    (
        "slack-webhook",
        "post to ",
        "https://hooks.slack.com/services/T" + tok(8, UPPER_DIGITS) + "/B" + tok(8, UPPER_DIGITS)
        + "/" + tok(24),
        " daily",
        "slack-webhook",
    ),
    ("google", "maps key ", "AIza" + tok(35, URLSAFE), " (browser)", "google-api-key"),
    ("stripe-sk-live", "", "sk_live_" + tok(24), " live", "stripe-key"),
    ("stripe-sk-test", "STRIPE=", "sk_test_" + tok(24), "", "stripe-key"),
    ("stripe-rk-live", "restricted ", "rk_live_" + tok(24), ".", "stripe-key"),
    ("stripe-rk-test", "", "rk_test_" + tok(99), "", "stripe-key"),
    ("huggingface", "HF ", "hf_" + tok(34), " read", "huggingface-token"),
    ("gitlab", "gitlab ", "glpat-" + tok(20, URLSAFE), " api", "gitlab-token"),
    ("npm", "//registry.npmjs.org/:_authToken=", "npm_" + tok(36), "\n", "npm-token"),
    ("pypi", "password = ", "pypi-AgEIcHlwaS5vcmc" + tok(120, URLSAFE), "\n", "pypi-token"),
    ("jwt", "cookie session=", JWT, "; Path=/", "jwt"),
    ("auth-bearer", "Authorization: Bearer ", tok(40, URLSAFE + "."), "\n", "authorization-header"),
    ("auth-basic-curl", 'curl -H "Authorization: Basic ', tok(24, B64) + "==", '" https://x',
     "authorization-header"),
    ("auth-json", '{"Authorization": "Token ', tok(32), '"}', "authorization-header"),
    ("auth-no-scheme", "authorization: ", tok(32), "", "authorization-header"),
    ("url-https", "clone https://alice:", tok(16), "@git.example.com/repo.git", "url-password"),
    ("url-postgres", "DATABASE_URL=postgres://app:", tok(20), "@db:5432/app", "url-password"),
    ("url-redis", "redis://default:", "p%40ss" + tok(8), "@cache:6379", "url-password"),
    ("generic-colon", "password: ", "hunter2xyz", "\n", "generic-secret"),
    ("generic-quoted", 'password = "', "hunter2", '"', "generic-secret"),
    ("generic-suffix-env", "DB_PASSWORD=", "s3cr3t!pass", "\n", "generic-secret"),
    ("generic-json", '"client_secret": "', tok(30), '",', "generic-secret"),
    ("generic-ruby", "api_key => '", tok(20), "'", "generic-secret"),
    ("generic-apikey", "apikey = ", tok(20), "", "generic-secret"),
    ("generic-access-key", "access_key: ", tok(20), "", "generic-secret"),
    ("generic-passwd", "passwd=", "Tr0ub4dor&3", " ", "generic-secret"),
    ("generic-pwd", "mysql --pwd=", "9xk2LmQp", " -u root", "generic-secret"),
    ("generic-secret-upper", "SECRET=", tok(24), "\n", "generic-secret"),
    ("generic-token-yaml", "  token: '", tok(20), "'\n", "generic-secret"),
    ("generic-camel", "dbPassword: '", "xyz12345", "'", "generic-secret"),
    ("generic-go", 'secret_token := "', tok(16), '"', "generic-secret"),
    ("generic-header", "x-api-key: ", tok(32), "\r\n", "generic-secret"),
    ("generic-query", "GET /cb?access_token=", tok(30), "&state=1", "generic-secret"),
    ("generic-markdown-bold", "**Password**: ", "Zebra-42-Lamp", " ", "generic-secret"),
    ("generic-bang", "password: ", "!Qaz2wsx", "\n", "generic-secret"),
]


NEGATIVES = [
    "request id 123e4567-e89b-12d3-a456-426614174000 failed",
    "fixed in commit 3f2a9c1d8e7b6a5f4e3d2c1b0a9f8e7d6c5b4a39",
    "sha: 3f2a9c1d8e7b6a5f4e3d2c1b0a9f8e7d6c5b4a39",
    "token: ${GITHUB_TOKEN}",
    "password: $DB_PASSWORD",
    "set password=%DB_PASSWORD% on windows",
    "api_key: <your-token>",
    "password: <see vault>",
    "token: '<your-token>'",
    "The token is stored in the keychain.",
    "Set your password in settings, then rotate the secret weekly.",
    "Token: stored in the keychain, never in the repo",
    'password = os.environ["DB_PASSWORD"]',
    "token: process.env.TOKEN",
    "api_key = settings.API_KEY",
    "password = get_password()",
    "def login(user: str, password: str) -> None:",
    "if token == expected_token:",
    "password: ",
    'password = ""',
    "password: xxx",
    "password: ********",
    "password: changeme",
    "api_key: YOUR_API_KEY_HERE",
    "max_tokens: 4096",
    "num_tokens = 128",
    "secret_name: prod-db",
    "pwd: /home/alice/project",
    "password: !vault |",
    "token: *default_token",
    "password: [REDACTED:generic-secret]",
    'GITHUB_TOKEN = "gh" + "p_" + suffix',
    "secret = 'abc' + make_rest()",
    "Authorization: required for all endpoints",
    "Authorization: Bearer <token>",
    'curl -H "Authorization: Bearer $TOKEN" https://api.example.com',
    "https://example.com:8080/path?q=1",
    "ssh://git@github.com:22/org/repo.git",
    "https://user@host.example.com/",
    "https://user:${PASSWORD}@host.example.com/",
    "ghp_short and sk-tooshort",
    "sk-learn-tutorial-for-beginners",
    "AKIAabcdefghijklmnop is lower case",
    "-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEA\n-----END PUBLIC KEY-----",
    "-----BEGIN CERTIFICATE-----\nMIIDdzCCAl+gAwIBAgIEAgAAuTANBgkqhkiG9w0BAQUF\n-----END CERTIFICATE-----",
    "Bearer tokens expire after an hour; refresh tokens last a day.",
    '"AccessToken": "minutes",',
    "See docs/auth.md for the API key rotation policy.",
]


PEM_LABELS = [
    "RSA PRIVATE KEY",
    "EC PRIVATE KEY",
    "DSA PRIVATE KEY",
    "OPENSSH PRIVATE KEY",
    "ENCRYPTED PRIVATE KEY",
    "PRIVATE KEY",
    "PGP PRIVATE KEY BLOCK",
]


def pem(label: str, newline: str = "\n") -> str:
    body = newline.join(tok(64, B64) for _ in range(5)) + newline + tok(20, B64) + "=="
    extra = f"Proc-Type: 4,ENCRYPTED{newline}DEK-Info: AES-128-CBC,{tok(32, UPPER_DIGITS)}{newline}{newline}"
    head = extra if label == "RSA PRIVATE KEY" else ""
    return f"-----BEGIN {label}-----{newline}{head}{body}{newline}-----END {label}-----"
