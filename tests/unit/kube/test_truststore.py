"""aiohttp's default contexts read the trust store on first hand-out, and trust exactly as before.

Each case runs in a fresh interpreter (this one imported aiohttp long ago), with the system trust
store replaced by one throwaway CA (``SSL_CERT_FILE``, an empty ``SSL_CERT_DIR``), so "what a
context trusts" is a fact the test can read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import declop
from declop.kube import truststore
from declop.testing.cluster import certs

ROOT = str(Path(declop.__file__).resolve().parent.parent)

CLIENT = textwrap.dedent(
    """
    import asyncio, json, ssl, sys
    import declop
    from declop.kube import truststore
    import aiohttp
    import aiohttp.connector as connector
    from aiohttp import web

    cert, key = sys.argv[1], sys.argv[2]
    out = {"deferred_at_import": truststore.deferred(),
           "cas_at_import": len(connector._SSL_CONTEXT_VERIFIED.get_ca_certs())}

    async def main():
        app = web.Application()
        app.router.add_get("/", lambda request: web.Response(text="ok"))
        runner = web.AppRunner(app)
        await runner.setup()
        served = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        served.load_cert_chain(cert, key)
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=served)
        await site.start()
        url = "https://127.0.0.1:%d/" % runner.addresses[0][1]
        async with aiohttp.ClientSession() as session:
            try:
                async with session.get(url) as response:
                    out["verified"] = await response.text()
            except aiohttp.ClientConnectorCertificateError:
                out["verified"] = "certificate refused"
            out["deferred_after_verified"] = truststore.deferred()
            async with session.get(url, ssl=False) as response:
                out["unverified"] = await response.text()
            out["deferred_after_unverified"] = truststore.deferred()
        out["cas_verified"] = sorted(str(c["subject"]) for c in connector._SSL_CONTEXT_VERIFIED.get_ca_certs())
        out["cas_unverified"] = sorted(str(c["subject"]) for c in connector._SSL_CONTEXT_UNVERIFIED.get_ca_certs())
        await runner.cleanup()

    asyncio.run(main())
    print(json.dumps(out))
    """
)

PLAIN = textwrap.dedent(
    """
    import json
    import aiohttp.connector as connector
    print(json.dumps({
        "cas_verified": sorted(str(c["subject"]) for c in connector._SSL_CONTEXT_VERIFIED.get_ca_certs()),
        "cas_unverified": sorted(str(c["subject"]) for c in connector._SSL_CONTEXT_UNVERIFIED.get_ca_certs()),
    }))
    """
)


def _run(code: str, trusted: str, tmp_path: Path, *args: str, pythonpath: str = ROOT) -> dict:
    empty = tmp_path / "no-cert-dir"
    empty.mkdir(exist_ok=True)
    env = {
        **os.environ,
        "SSL_CERT_FILE": trusted,
        "SSL_CERT_DIR": str(empty),
        "PYTHONPATH": pythonpath,
    }
    done = subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_import_defers_both_reads_and_the_first_handout_of_each_reads_it_once(tmp_path):
    pki = certs.generate(tmp_path / "pki")
    out = _run(CLIENT, pki.serving_ca.cert, tmp_path, pki.apiserver.cert, pki.apiserver.key)

    assert out["deferred_at_import"] == 2
    assert out["cas_at_import"] == 0
    assert out["verified"] == "ok"
    assert out["deferred_after_verified"] == 1
    assert out["unverified"] == "ok"
    assert out["deferred_after_unverified"] == 0
    # Both contexts end up trusting what aiohttp alone makes them trust: the system store, here one CA.
    plain = _run(PLAIN, pki.serving_ca.cert, tmp_path)
    assert out["cas_verified"] == plain["cas_verified"] == plain["cas_unverified"] == out["cas_unverified"]
    assert "declop-serving-ca" in out["cas_verified"][0]


def test_a_deferred_context_still_refuses_a_server_the_trust_store_does_not_vouch_for(tmp_path):
    pki = certs.generate(tmp_path / "pki")
    out = _run(CLIENT, pki.client_ca.cert, tmp_path, pki.apiserver.cert, pki.apiserver.key)

    assert out["verified"] == "certificate refused"
    assert out["unverified"] == "ok"
    assert "declop-client-ca" in out["cas_verified"][0]


def test_aiohttp_imported_before_declop_is_left_as_it_was(tmp_path):
    pki = certs.generate(tmp_path / "pki")
    code = "import json, aiohttp, declop\nfrom declop.kube import truststore\n" + (
        "import aiohttp.connector as c\n"
        "print(json.dumps({'deferred': truststore.deferred(), 'cas': len(c._SSL_CONTEXT_VERIFIED.get_ca_certs())}))"
    )
    out = _run(code, pki.serving_ca.cert, tmp_path)

    assert out == {"deferred": 0, "cas": 1}


FAKE_CONNECTOR = textwrap.dedent(
    """
    import ssl, threading

    beside = {}

    def _other_thread():
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.set_default_verify_paths()
        beside["cas"] = len(ctx.get_ca_certs())

    _thread = threading.Thread(target=_other_thread)
    _thread.start()
    _thread.join()

    # The two module-level contexts, but no TCPConnector: a layout truststore does not know.
    _SSL_CONTEXT_VERIFIED = ssl.create_default_context()
    _SSL_CONTEXT_UNVERIFIED = ssl.create_default_context()
    """
)

LOAD_ALONE = textwrap.dedent(
    """
    import importlib.util, json, ssl, sys
    spec = importlib.util.spec_from_file_location("truststore_alone", sys.argv[1])
    truststore = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(truststore)
    connector = truststore.import_aiohttp()
    print(json.dumps({
        "beside": connector.beside["cas"],
        "verified": len(connector._SSL_CONTEXT_VERIFIED.get_ca_certs()),
        "unverified": len(connector._SSL_CONTEXT_UNVERIFIED.get_ca_certs()),
        "deferred": truststore.deferred(),
        "patch_left": "set_default_verify_paths" in vars(ssl.SSLContext),
    }))
    """
)


def test_other_threads_and_an_unknown_aiohttp_layout_read_the_trust_store_at_once(tmp_path):
    pki = certs.generate(tmp_path / "pki")
    fake = tmp_path / "fake" / "aiohttp"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "connector.py").write_text(FAKE_CONNECTOR)

    out = _run(
        LOAD_ALONE, pki.serving_ca.cert, tmp_path, truststore.__file__, pythonpath=str(tmp_path / "fake")
    )

    assert out == {"beside": 1, "verified": 1, "unverified": 1, "deferred": 0, "patch_left": False}
