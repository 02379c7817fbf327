"""Encryption interop between the PubNub Python SDK and the Tether Swift SDK, both ways.

Deterministic by construction: vectors are files, not live processes.

* `Tests/TetherTests/Fixtures/crypto-vectors-python.json` holds ciphertexts made by the PubNub
  Python SDK (legacy cryptor with random and static IV, header-based AES-CBC) plus an Access
  Manager token encoded as CBOR. The Swift test `CryptoInteropTests` decrypts every one.
  Regenerate it with `python Tests/Conformance/test_crypto_interop.py --write-python-vectors`.
* `Tests/TetherTests/Fixtures/crypto-vectors-swift.json` holds ciphertexts made by the Swift SDK
  (regenerate with `TETHER_WRITE_CRYPTO_VECTORS=1 swift test --filter CryptoInteropTests`).
  The tests below decrypt every one with the Python SDK's crypto modules.
"""

from __future__ import annotations

import base64
import json
import os
import sys

import pytest

from pubnub.crypto import AesCbcCryptoModule, LegacyCryptoModule
from pubnub.pnconfiguration import PNConfiguration

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "TetherTests", "Fixtures")
PYTHON_VECTORS = os.path.join(FIXTURES, "crypto-vectors-python.json")
SWIFT_VECTORS = os.path.join(FIXTURES, "crypto-vectors-swift.json")

MESSAGES = [
    {"text": "hello"},
    "plain string",
    42,
    [1, 2, {"nested": True}],
    {"unicode": "héllo wörld ✓ 🚀", "quote": "\"", "slash": "a/b"},
    {"long": "x" * 300},
]


def module(cryptor: str, cipher_key: str):
    config = PNConfiguration()
    config.cipher_key = cipher_key
    if cryptor == "legacy-random-iv":
        config.use_random_initialization_vector = True
        return LegacyCryptoModule(config)
    if cryptor == "legacy-static-iv":
        config.use_random_initialization_vector = False
        return LegacyCryptoModule(config)
    if cryptor == "aes-cbc":
        config.use_random_initialization_vector = True
        return AesCbcCryptoModule(config)
    raise ValueError(cryptor)


def load(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def swift_cases():
    if not os.path.exists(SWIFT_VECTORS):
        return []
    return load(SWIFT_VECTORS)["cases"]


def test_fixture_files_exist():
    assert os.path.exists(PYTHON_VECTORS), "generate with --write-python-vectors"
    assert os.path.exists(SWIFT_VECTORS), "generate with TETHER_WRITE_CRYPTO_VECTORS=1 swift test --filter CryptoInteropTests"


# AES-GCM vectors are Tether-only by design: PubNub SDKs cannot read them.
@pytest.mark.parametrize("case", [c for c in swift_cases() if c["cryptor"] != "aes-gcm"],
                         ids=lambda c: f"{c['cryptor']}-{c['index']}")
def test_python_decrypts_swift(case):
    """Swift (Tether) encrypted → PubNub Python decrypts to the same JSON value."""
    decrypted = module(case["cryptor"], case["cipher_key"]).decrypt(case["ciphertext"])
    assert decrypted == json.loads(case["plaintext_json"])


def test_swift_aes_cbc_vectors_carry_the_pned_header():
    cases = [c for c in swift_cases() if c["cryptor"] == "aes-cbc"]
    assert cases
    for case in cases:
        raw = base64.b64decode(case["ciphertext"])
        assert raw[:4] == b"PNED" and raw[4] == 1 and raw[5:9] == b"ACRH" and raw[9] == 16


def test_python_vectors_still_decrypt_in_python():
    """The committed Python vectors are what this SDK version produces and reads."""
    for case in load(PYTHON_VECTORS)["cases"]:
        assert module(case["cryptor"], case["cipher_key"]).decrypt(case["ciphertext"]) == json.loads(case["plaintext_json"])


def test_python_aes_cbc_module_reads_legacy_swift_vectors():
    """PubNub's AES-CBC module falls back to the legacy cryptor for header-less data, like Tether's."""
    for case in swift_cases():
        if case["cryptor"] == "legacy-random-iv":
            decrypted = module("aes-cbc", case["cipher_key"]).decrypt(case["ciphertext"])
            assert decrypted == json.loads(case["plaintext_json"])


def write_python_vectors():
    import cbor2

    cases = []
    for cryptor in ("legacy-random-iv", "legacy-static-iv", "aes-cbc"):
        for index, message in enumerate(MESSAGES):
            key = f"python-key-{cryptor}"
            text = json.dumps(message)  # exactly what the Python SDK encrypts on publish
            cases.append({"cryptor": cryptor, "index": index, "cipher_key": key, "plaintext_json": text,
                          "ciphertext": module(cryptor, key).encrypt(text)})
    token_map = {
        b"v": 2, b"t": 1747918912, b"ttl": 60,
        b"res": {b"chan": {"test-channel": 1, "rw": 3}, b"grp": {"g1": 5}, b"uuid": {}, b"usr": {}, b"spc": {"test-channel": 1}},
        b"pat": {b"chan": {"^chat-.*$": 3}, b"grp": {}, b"uuid": {}, b"usr": {}, b"spc": {}},
        b"meta": {"k": "v", "n": 7}, b"uuid": "specific-uuid", b"sig": bytes(range(32)),
    }
    token = base64.urlsafe_b64encode(cbor2.dumps(token_map)).decode().rstrip("=")
    data = {"generator": "pubnub 10.8.0 (Python) — Tests/Conformance/test_crypto_interop.py", "cases": cases,
            "token": token}
    os.makedirs(FIXTURES, exist_ok=True)
    with open(PYTHON_VECTORS, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {len(cases)} cases to {PYTHON_VECTORS}")


if __name__ == "__main__":
    if "--write-python-vectors" in sys.argv:
        write_python_vectors()
    else:
        print(__doc__)
