"""@declop.on_login and LoginConfig: what a login function may return, and exactly when it is
called (start, expiration, 401), one call at a time, failures named."""

from __future__ import annotations

import asyncio
import datetime
import time
from pathlib import Path
from typing import Any

import pytest

import declop
from declop.errors import ApiError, RegistrationError
from declop.kube.login import ConnectionInfo, LoginConfig, connection_info, refresh_at
from declop.lifecycle import login_function
from declop.registry import Registry
from declop.testing.cluster.certs import generate

SERVER = "https://127.0.0.1:6443"


class Answers:
    """A login function answering from a list (the last one repeats), counting its calls."""

    def __init__(self, *answers: Any, delay: float = 0.0) -> None:
        self.answers, self.delay, self.calls = list(answers), delay, 0

    async def __call__(self) -> Any:
        self.calls += 1
        if self.delay:
            await asyncio.sleep(self.delay)
        answer = self.answers[min(self.calls, len(self.answers)) - 1]
        if isinstance(answer, Exception):
            raise answer
        return answer


# -- what a login function returns ---------------------------------------------------------------


def test_a_mapping_or_a_connection_info_is_accepted() -> None:
    info = connection_info({"server": SERVER, "token": "t", "ca_data": "PEM"}, "f")
    assert info == ConnectionInfo(server=SERVER, token="t", ca_data="PEM")
    assert "s3cr3t" not in repr(ConnectionInfo(server=SERVER, token="s3cr3t", key_data="s3cr3t"))


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (None, "returned None: no credentials"),
        ({"server": SERVER, "tokn": "t"}, r"returned unknown keys \['tokn'\]"),
        ({"token": "t"}, "returned no 'server'"),
        ("token", "returned a str, not a ConnectionInfo or a mapping"),
        ({"server": "127.0.0.1:6443", "token": "t"}, "give the apiserver's https:// URL$"),
        ({"server": SERVER, "cert_data": "C"}, "neither a token nor a client certificate and key"),
    ],
)
def test_what_is_not_credentials_is_one_line_naming_the_function(value: Any, message: str) -> None:
    with pytest.raises(ValueError, match=rf"^login function 'f' (returned )?.*{message}"):
        connection_info(value, "f")


def test_refresh_time_is_a_fifth_of_the_lifetime_before_expiration_at_most_a_minute() -> None:
    now = time.monotonic()
    assert refresh_at(None) == float("inf")
    assert refresh_at(time.time() + 100) == pytest.approx(now + 80, abs=1)
    assert refresh_at(datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1)) == pytest.approx(now + 3540, abs=1)


# -- when it is called ----------------------------------------------------------------------------


def test_called_once_at_start_and_not_again_without_expiration() -> None:
    login = Answers(ConnectionInfo(server=SERVER + "/", token="one"))

    async def main() -> list[Any]:
        cfg = await LoginConfig.first(login, "f")
        return [cfg.host, await cfg.headers(), await cfg.headers(), cfg.logins]

    assert asyncio.run(main()) == [SERVER, {"Authorization": "Bearer one"}, {"Authorization": "Bearer one"}, 1]
    assert login.calls == 1


def test_called_again_at_its_refresh_time() -> None:
    soon = time.time() + 0.5  # refreshed a fifth of 0.5 s before: at about 0.4 s
    login = Answers({"server": SERVER, "token": "one", "expiration": soon}, {"server": SERVER, "token": "two"})

    async def main() -> list[Any]:
        cfg = await LoginConfig.first(login, "f")
        seen = [await cfg.headers()]
        await asyncio.sleep(0.45)
        seen += [await cfg.headers(), await cfg.headers()]
        return seen

    assert asyncio.run(main()) == [{"Authorization": "Bearer one"}, {"Authorization": "Bearer two"}, {"Authorization": "Bearer two"}]
    assert login.calls == 2


def test_a_401_asks_again_before_the_retry() -> None:
    login = Answers({"server": SERVER, "token": "stale"}, {"server": SERVER, "token": "fresh"})

    async def main() -> list[Any]:
        cfg = await LoginConfig.first(login, "f")
        before = await cfg.headers()
        assert cfg.unauthorized() is True  # the transport retries the request once
        return [before, await cfg.headers()]

    assert asyncio.run(main()) == [{"Authorization": "Bearer stale"}, {"Authorization": "Bearer fresh"}]


def test_401s_of_requests_sent_with_one_refused_credential_ask_for_one_login() -> None:
    """Informers start together: several requests leave with the first answer, all get 401. The
    first 401 asks again; the later ones — sent before that new answer — retry with it instead of
    asking once each (the fresh-clone run saw ["bad", "admin", "admin"] in test_embedding)."""
    login = Answers({"server": SERVER, "token": "bad"}, {"server": SERVER, "token": "good"}, {"server": SERVER, "token": "third"})

    async def main() -> list[Any]:
        cfg = await LoginConfig.first(login, "f")
        sent = [cfg.epoch for _ in range(3)]  # three requests in flight with "bad"
        seen = []
        for epoch in sent:  # their 401s come back one after another, each retried
            assert cfg.unauthorized(epoch) is True
            seen.append(await cfg.headers())
        return seen

    assert asyncio.run(main()) == [{"Authorization": "Bearer good"}] * 3
    assert login.calls == 2


def test_one_call_at_a_time_concurrent_requests_share_it() -> None:
    login = Answers({"server": SERVER, "token": "one"}, {"server": SERVER, "token": "two"}, delay=0.05)

    async def main() -> list[Any]:
        cfg = await LoginConfig.first(login, "f")
        cfg.unauthorized()
        return await asyncio.gather(*(cfg.headers() for _ in range(5)))

    assert asyncio.run(main()) == [{"Authorization": "Bearer two"}] * 5
    assert login.calls == 2


def test_a_later_failure_fails_the_request_without_its_text_and_the_next_asks_again() -> None:
    login = Answers({"server": SERVER, "token": "one"}, RuntimeError("vault says secret=xyz"), {"server": SERVER, "token": "three"})

    async def main() -> Any:
        cfg = await LoginConfig.first(login, "f")
        cfg.unauthorized()
        with pytest.raises(ApiError, match=r"^login function 'f' failed: RuntimeError$") as caught:
            await cfg.headers()
        assert caught.value.reason == "Credentials" and "xyz" not in str(caught.value)
        return await cfg.headers()

    assert asyncio.run(main()) == {"Authorization": "Bearer three"}
    assert login.calls == 3


def test_a_client_certificate_and_ca_make_the_tls_context(tmp_path: Path) -> None:
    certs = generate(tmp_path / "pki")
    cert, key = Path(certs.admin.cert).read_bytes(), Path(certs.admin.key).read_text()  # bytes or str
    login = Answers({"server": SERVER, "cert_data": cert, "key_data": key, "ca_data": Path(certs.serving_ca.cert).read_text()})

    async def main() -> Any:
        cfg = await LoginConfig.first(login, "f")
        return await cfg.headers(), await cfg.ssl_context(), cfg

    headers, ctx, cfg = asyncio.run(main())
    assert headers == {} and ctx is not None
    assert "BEGIN" not in repr(cfg) and "login='f'" in repr(cfg)


# -- registration ---------------------------------------------------------------------------------


def test_on_login_returns_the_function_and_takes_only_a_logger() -> None:
    registry = Registry()

    def creds(logger):
        return None

    assert declop.on_login(registry=registry)(creds) is creds
    assert [(h.kind, h.name) for h in registry.hooks] == [("login", "creds")]

    def wants_client(client):
        return None

    with pytest.raises(RegistrationError, match=r"takes an unknown argument 'client'; declop passes only logger"):
        declop.on_login(wants_client, registry=Registry())


def test_the_first_login_that_answers_wins_in_registration_order() -> None:
    registry = Registry()
    called: list[str] = []

    @declop.on_login(registry=registry)
    def nothing():
        called.append("nothing")

    @declop.on_login(registry=registry)
    async def vault(logger):
        called.append("vault")
        return {"server": SERVER, "token": "v"}

    @declop.on_login(registry=registry)
    def never():
        called.append("never")

    assert asyncio.run(login_function(registry.hooks)()) == {"server": SERVER, "token": "v"}
    assert called == ["nothing", "vault"]


def test_a_first_login_that_fails_fails_the_start_with_one_line() -> None:
    from declop.errors import ConfigError
    from declop.manager import Manager

    registry = Registry()

    @declop.on_login(registry=registry)
    def vault():
        raise KeyError("kubernetes/operator")

    @registry.reconciler("configmaps")
    def noop(**_):
        pass

    with pytest.raises(ConfigError, match=r"^login function 'vault' failed: KeyError: 'kubernetes/operator'; the operator did not start$"):
        asyncio.run(Manager(None, registry).setup())


def test_the_manager_connects_with_the_first_answer() -> None:
    from declop.manager import Manager

    registry = Registry()
    declop.on_login(lambda: {"server": SERVER, "token": "t"}, name="static", registry=registry)
    manager = Manager(None, registry)
    cfg = asyncio.run(manager._login())
    assert isinstance(cfg, LoginConfig) and cfg.host == SERVER and cfg.source == "login function 'static'"


def test_a_given_configuration_wins_over_the_login_function() -> None:
    """declop dev and OperatorRunner give their own configuration: the login is not asked."""
    from declop.kube.restconfig import RestConfig
    from declop.manager import Manager

    registry = Registry()
    asked: list[bool] = []
    declop.on_login(lambda: asked.append(True), name="never", registry=registry)

    @registry.reconciler("configmaps")
    def noop(**_):
        pass

    manager = Manager(RestConfig(host="https://127.0.0.1:1"), registry)  # nothing listens there
    with pytest.raises(Exception, match="127.0.0.1:1"):
        asyncio.run(manager.setup())
    assert asked == []


def test_no_configuration_and_no_login_is_one_line() -> None:
    from declop.errors import ConfigError
    from declop.manager import Manager

    registry = Registry()
    registry.reconciler("configmaps")(lambda **_: None)
    with pytest.raises(ConfigError, match="^no apiserver to talk to: pass a configuration"):
        asyncio.run(Manager(None, registry).setup())
