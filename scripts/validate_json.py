#!/usr/bin/env python3
"""Validates constrained outputs: reads JSON lines {"name", "schema", "output"}
(output: the generated text) from the file given (or stdin), parses each
output as JSON and validates it against its schema (Draft 2020-12, formats
checked). Prints one line per failure and a summary; exits 1 if any failed.

Debian's python3-jsonschema (scripts/setup.sh) checks date and uuid; it checks
time and date-time only with the optional rfc3339-validator, so both are
checked here (RFC 3339 full-time / date-time) whatever is installed.
"""
import datetime
import json
import re
import sys

import jsonschema

_TIME = re.compile(r"(\d\d):(\d\d):(\d\d)(\.\d+)?([Zz]|[+-](\d\d):(\d\d))")


def is_time(s):
    if not isinstance(s, str):
        return True
    m = _TIME.fullmatch(s)
    if not m:
        return False
    h, mi, sec = int(m[1]), int(m[2]), int(m[3])
    if h > 23 or mi > 59 or sec > 60:
        return False
    return m[6] is None or (int(m[6]) <= 23 and int(m[7]) <= 59)


def is_date_time(s):
    if not isinstance(s, str):
        return True
    parts = re.split("[Tt]", s, maxsplit=1)
    if len(parts) != 2 or not re.fullmatch(r"\d{4}-\d\d-\d\d", parts[0]):
        return False
    try:
        datetime.date.fromisoformat(parts[0])
    except ValueError:
        return False
    return is_time(parts[1])


def main():
    src = open(sys.argv[1], encoding="utf-8") if len(sys.argv) > 1 else sys.stdin
    checker = jsonschema.FormatChecker()
    checker.checks("time")(is_time)
    checker.checks("date-time")(is_date_time)
    n = failed = 0
    for line in src:
        if not line.strip():
            continue
        rec = json.loads(line)
        n += 1
        try:
            value = json.loads(rec["output"])
        except ValueError as e:
            failed += 1
            print("FAIL %s: not JSON (%s): %r" % (rec["name"], e, rec["output"][:200]))
            continue
        v = jsonschema.Draft202012Validator(rec["schema"], format_checker=checker)
        errors = list(v.iter_errors(value))
        if errors:
            failed += 1
            print("FAIL %s: %s: %r" % (rec["name"], errors[0].message[:200], rec["output"][:200]))
    print("validated %d outputs, %d failed" % (n, failed))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
