"""declop.logs: ReconcileLogger pairs, the plain and JSON line shapes, and ``configure``."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from declop.logs import REDACTED, JsonFormatter, PlainFormatter, ReconcileLogger, configure, kv, redact

RID = "0b9f6c1e-4f4e-4a57-9d7a-3c1f2f0d1e2a"
CONTEXT = {"controller": "example", "namespace": "default", "name": "nginx", "reconcileID": RID}


class Capture(logging.Handler):
    """Formats every record it receives with the given formatter."""

    def __init__(self, formatter: logging.Formatter) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(formatter)
        self.lines: list[str] = []
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self.lines.append(self.format(record))


@pytest.fixture
def std_logger(request: pytest.FixtureRequest) -> Iterator[logging.Logger]:
    logger = logging.getLogger(f"declop.tests.{request.node.name}")
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    yield logger
    for h in list(logger.handlers):
        logger.removeHandler(h)
    logger.setLevel(logging.NOTSET)
    logger.propagate = True


def bound(logger: logging.Logger, formatter: logging.Formatter) -> tuple[ReconcileLogger, Capture]:
    cap = Capture(formatter)
    logger.addHandler(cap)
    return ReconcileLogger(logger, CONTEXT), cap


# -- plain --------------------------------------------------------------------------------


def test_plain_line_is_exactly_the_seed_shape(std_logger: logging.Logger) -> None:
    log, cap = bound(std_logger, PlainFormatter())
    log.info("Pod created")
    expected = (
        'INFO Pod created {"controller": "example", "namespace": "default", "name": "nginx", '
        f'"reconcileID": "{RID}"}}'
    )
    assert cap.lines == [expected]


def test_plain_extra_pairs_come_after_the_bound_ones(std_logger: logging.Logger) -> None:
    log, cap = bound(std_logger, PlainFormatter())
    log.warning("Scaled", replicas=3, target="web")
    expected = (
        'WARNING Scaled {"controller": "example", "namespace": "default", "name": "nginx", '
        f'"reconcileID": "{RID}", "replicas": 3, "target": "web"}}'
    )
    assert cap.lines == [expected]


def test_bind_adds_pairs_without_changing_the_original(std_logger: logging.Logger) -> None:
    log, cap = bound(std_logger, PlainFormatter())
    child = log.bind(step="apply")
    child.error("Failed", attempt=2)
    log.info("Plain")
    assert cap.lines[0].endswith(f'"reconcileID": "{RID}", "step": "apply", "attempt": 2}}')
    assert cap.lines[0].startswith("ERROR Failed {")
    assert '"step"' not in cap.lines[1]
    assert log.context == CONTEXT


def test_plain_without_pairs_and_with_args() -> None:
    record = logging.makeLogRecord({"levelname": "DEBUG", "msg": "n=%d", "args": (5,)})
    assert PlainFormatter().format(record) == "DEBUG n=5"


def test_positional_args_are_interpolated(std_logger: logging.Logger) -> None:
    log, cap = bound(std_logger, PlainFormatter())
    log.debug("got %s items", 4)
    assert cap.lines[0].startswith("DEBUG got 4 items {")


def test_level_filtering(std_logger: logging.Logger) -> None:
    log, cap = bound(std_logger, PlainFormatter())
    std_logger.setLevel(logging.WARNING)
    log.debug("hidden")
    log.info("hidden")
    log.warn("shown")  # noqa: G010 - the alias is part of the API
    assert [line.split(" {")[0] for line in cap.lines] == ["WARNING shown"]
    assert log.isEnabledFor(logging.WARNING)
    assert not log.isEnabledFor(logging.INFO)


def test_record_points_at_the_handler_code(std_logger: logging.Logger) -> None:
    log, cap = bound(std_logger, PlainFormatter())
    log.info("where")
    assert cap.records[0].funcName == "test_record_points_at_the_handler_code"
    assert cap.records[0].pathname == __file__


def test_non_json_values_are_rendered_with_str() -> None:
    class Thing:
        def __str__(self) -> str:
            return "thing!"

    assert kv({"a": Thing(), "b": "é"}) == '{"a": "thing!", "b": "é"}'


def test_plain_exception_includes_traceback(std_logger: logging.Logger) -> None:
    log, cap = bound(std_logger, PlainFormatter())
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        log.exception("Reconcile failed", attempt=1)
    first, *rest = cap.lines[0].split("\n")
    assert first == (
        'ERROR Reconcile failed {"controller": "example", "namespace": "default", "name": "nginx", '
        f'"reconcileID": "{RID}", "attempt": 1}}'
    )
    tb = "\n".join(rest)
    assert tb.startswith("Traceback (most recent call last):")
    assert "RuntimeError: boom" in tb


def test_exc_info_argument(std_logger: logging.Logger) -> None:
    log, cap = bound(std_logger, PlainFormatter())
    try:
        raise KeyError("k")
    except KeyError as exc:
        log.warning("Ignored", exc_info=exc)
    assert "KeyError: 'k'" in cap.lines[0]


# -- json ---------------------------------------------------------------------------------


def test_json_one_object_per_line(std_logger: logging.Logger) -> None:
    log, cap = bound(std_logger, JsonFormatter())
    log.info("Pod created", replicas=3)
    log.info("Second\nline")
    assert len(cap.lines) == 2
    assert all("\n" not in line for line in cap.lines)
    doc = json.loads(cap.lines[0])
    assert list(doc) == [
        "ts",
        "level",
        "logger",
        "msg",
        "controller",
        "namespace",
        "name",
        "reconcileID",
        "replicas",
    ]
    assert doc["level"] == "INFO"
    assert doc["logger"] == std_logger.name
    assert doc["msg"] == "Pod created"
    assert {k: doc[k] for k in CONTEXT} == CONTEXT
    assert doc["replicas"] == 3
    assert json.loads(cap.lines[1])["msg"] == "Second\nline"


def test_json_timestamp_is_utc_iso_milliseconds() -> None:
    record = logging.makeLogRecord({"name": "x", "levelname": "INFO", "msg": "m", "created": 1.5})
    doc = json.loads(JsonFormatter().format(record))
    assert doc == {
        "ts": "1970-01-01T00:00:01.500+00:00",
        "level": "INFO",
        "logger": "x",
        "msg": "m",
    }


def test_json_pairs_cannot_override_the_standard_fields() -> None:
    record = logging.makeLogRecord(
        {
            "name": "x",
            "levelname": "INFO",
            "msg": "real",
            "created": 0.0,
            "kv": {"msg": "fake", "level": "X", "k": 1},
        }
    )
    doc = json.loads(JsonFormatter().format(record))
    assert doc["msg"] == "real"
    assert doc["level"] == "INFO"
    assert doc["k"] == 1


def test_json_exception_in_error_field(std_logger: logging.Logger) -> None:
    log, cap = bound(std_logger, JsonFormatter())
    try:
        raise ValueError("bad spec")
    except ValueError:
        log.exception("Reconcile failed")
    assert len(cap.lines) == 1
    doc = json.loads(cap.lines[0])
    assert doc["level"] == "ERROR"
    assert doc["error"].startswith("Traceback (most recent call last):")
    assert "ValueError: bad spec" in doc["error"]


# -- configure ----------------------------------------------------------------------------


@pytest.fixture
def clean_root() -> Iterator[logging.Logger]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    noisy = {n: logging.getLogger(n).level for n in ("kubernetes", "urllib3", "aiohttp", "asyncio")}
    yield root
    for h in list(root.handlers):
        if h not in handlers:
            root.removeHandler(h)
    root.setLevel(level)
    for n, lvl in noisy.items():
        logging.getLogger(n).setLevel(lvl)


def declop_handlers(root: logging.Logger) -> list[logging.Handler]:
    return [h for h in root.handlers if getattr(h, "_declop", False)]


def test_configure_twice_installs_exactly_one_handler(clean_root: logging.Logger) -> None:
    before = len(clean_root.handlers)
    first = configure("plain", logging.INFO, io.StringIO())
    second = configure("json", logging.DEBUG, io.StringIO())
    assert declop_handlers(clean_root) == [second]
    assert first not in clean_root.handlers
    assert len(clean_root.handlers) == before + 1
    assert isinstance(second.formatter, JsonFormatter)
    assert clean_root.level == logging.DEBUG


def test_configure_keeps_foreign_handlers(clean_root: logging.Logger) -> None:
    foreign = logging.NullHandler()
    clean_root.addHandler(foreign)
    configure(stream=io.StringIO())
    configure(stream=io.StringIO())
    assert foreign in clean_root.handlers
    assert len(declop_handlers(clean_root)) == 1


def test_configure_plain_writes_to_stream(clean_root: logging.Logger) -> None:
    stream = io.StringIO()
    handler = configure("plain", logging.INFO, stream)
    assert isinstance(handler.formatter, PlainFormatter)
    logger = logging.getLogger("declop.tests.configure")
    ReconcileLogger(logger, {"controller": "c"}).info("hello", n=1)
    assert stream.getvalue() == 'INFO hello {"controller": "c", "n": 1}\n'


def test_configure_quiets_third_party_loggers(clean_root: logging.Logger) -> None:
    configure(level=logging.DEBUG, stream=io.StringIO())
    assert logging.getLogger("urllib3").level == logging.WARNING
    configure(level=logging.ERROR, stream=io.StringIO())
    assert logging.getLogger("aiohttp").level == logging.ERROR


SECRET = {"kind": "Secret", "metadata": {"name": "db"}, "data": {"password": "c2VjcmV0"}, "stringData": {"user": "root"}}


def test_redact_hides_secret_values_keeps_keys_at_any_depth() -> None:
    pairs = {"obj": SECRET, "list": [SECRET], "other": {"kind": "ConfigMap", "data": {"k": "v"}}}
    out = redact(pairs)
    assert out["obj"]["data"] == {"password": REDACTED} and out["obj"]["stringData"] == {"user": REDACTED}
    assert out["list"][0]["data"] == {"password": REDACTED}
    assert out["other"] is pairs["other"]  # not a Secret: untouched, not copied
    assert SECRET["data"]["password"] == "c2VjcmV0"  # the original is not changed
    plain = {"a": 1}
    assert redact(plain) is plain


@pytest.mark.parametrize("formatter", [PlainFormatter(), JsonFormatter()], ids=["plain", "json"])
def test_both_formatters_redact_secrets_given_as_pairs(formatter: logging.Formatter) -> None:
    record = logging.LogRecord("x", logging.DEBUG, __file__, 1, "got it", (), None)
    record.kv = {"obj": SECRET}
    line = formatter.format(record)
    assert "c2VjcmV0" not in line and "root" not in line and "password" in line


def test_redact_covers_read_only_views_and_secret_lists() -> None:
    """A predicate's read-only view, a list of them, or a SecretList (its items carry no kind)."""
    from declop.cache.store import readonly

    secret_list = {"kind": "SecretList", "items": [{"metadata": {"name": "db"}, "data": {"password": "c2VjcmV0"}}]}
    for value in (readonly(SECRET), readonly([SECRET]), (SECRET,), secret_list, readonly(secret_list)):
        out = redact({"v": value})
        assert "c2VjcmV0" not in json.dumps(out) and "root" not in json.dumps(out), out
        assert "password" in json.dumps(out)
    view = redact(readonly({"kind": "ConfigMap", "data": {"k": "v"}}))
    assert type(view) is dict and view == {"kind": "ConfigMap", "data": {"k": "v"}}  # JSON, not a repr
    assert redact((1, 2)) == (1, 2) and redact("text") == "text"


@pytest.mark.parametrize("formatter", [PlainFormatter(), JsonFormatter()], ids=["plain", "json"])
@pytest.mark.parametrize("shape", ["view", "list", "secretlist", "arg"])
def test_both_formatters_redact_every_shape(formatter: logging.Formatter, shape: str) -> None:
    from declop.cache.store import readonly

    record = logging.LogRecord("x", logging.DEBUG, __file__, 1, "got it", (), None)
    if shape == "view":
        record.kv = {"obj": readonly(SECRET)}
    elif shape == "list":
        record.kv = {"objs": readonly([SECRET, SECRET])}
    elif shape == "secretlist":
        record.kv = {"objs": {"kind": "SecretList", "items": [{"data": {"password": "c2VjcmV0"}}]}}
    else:
        record.msg, record.args = "got %s and %r", (SECRET, readonly(SECRET))
    line = formatter.format(record)
    assert "c2VjcmV0" not in line and "root" not in line and "password" in line, line


def test_a_read_only_view_repr_hides_secret_values() -> None:
    from declop.cache.store import readonly

    assert "c2VjcmV0" not in repr(readonly(SECRET)) and "c2VjcmV0" not in repr(readonly([SECRET]))
