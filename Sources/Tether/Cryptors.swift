import Crypto
import CryptoExtras
import Foundation
import TetherClientCore
public import TetherProtocol

/// Why encryption or decryption failed.
public struct CryptoError: Error, Sendable, Hashable, CustomStringConvertible {
    /// What went wrong.
    public var reason: String
    /// Creates the error.
    public init(_ reason: String) { self.reason = reason }
    /// A message for humans.
    public var description: String { reason }
}

/// The output of a ``Cryptor``: the ciphertext and the data the header carries (the IV or nonce).
public struct EncryptedData: Sendable, Hashable {
    /// Cryptor-specific data stored in the `PNED` header (an IV or nonce); empty for the legacy cryptor.
    public var metadata: [UInt8]
    /// The ciphertext (for the legacy cryptor with a random IV: IV + ciphertext).
    public var data: [UInt8]
    /// Creates the value.
    public init(metadata: [UInt8], data: [UInt8]) {
        self.metadata = metadata
        self.data = data
    }
}

/// One encryption algorithm, identified by the 4-byte id written in the `PNED` header
/// (pubnub-wire §15). Combine cryptors in a ``CryptoModule``.
public protocol Cryptor: Sendable {
    /// The 4-character cryptor id (`"ACRH"`, `"TGCM"`); `"0000"` is the legacy cryptor, which writes no header.
    var identifier: String { get }
    /// Encrypts bytes.
    func encrypt(_ plaintext: [UInt8]) throws(CryptoError) -> EncryptedData
    /// Decrypts bytes.
    func decrypt(_ encrypted: EncryptedData) throws(CryptoError) -> [UInt8]
}

/// PubNub's legacy cryptor (`0000`): AES-256-CBC with PKCS#7 padding; the key is the first 32
/// characters of the lowercase hex SHA-256 of the cipher key, used as raw bytes; the IV is either
/// the static `0123456789012345` or 16 random bytes prepended to the ciphertext.
///
/// Interoperable with the PubNub SDKs' `cipherKey` + `useRandomInitializationVector`. Prefer
/// ``AESGCMCryptor`` for Tether-only apps: CBC is not authenticated.
public struct LegacyCryptor: Cryptor {
    /// `"0000"`.
    public let identifier = "0000"
    /// Whether a random IV is generated and prepended (PubNub's default) or the static IV used.
    public let usesRandomIV: Bool
    private let key: SymmetricKey
    private static let staticIV = Array("0123456789012345".utf8)

    /// Creates the cryptor.
    public init(cipherKey: String, usesRandomIV: Bool = true) {
        let hex = SHA256.hash(data: Array(cipherKey.utf8)).map { String(format: "%02x", $0) }.joined()
        key = SymmetricKey(data: Array(hex.utf8.prefix(32)))
        self.usesRandomIV = usesRandomIV
    }

    /// Encrypts; the result's `data` is `IV + ciphertext` with a random IV, the bare ciphertext otherwise.
    public func encrypt(_ plaintext: [UInt8]) throws(CryptoError) -> EncryptedData {
        var iv = Self.staticIV
        if usesRandomIV { iv = randomBytes(16) }
        do {
            let ciphertext = try AES._CBC.encrypt(plaintext, using: key, iv: AES._CBC.IV(ivBytes: iv))
            return EncryptedData(metadata: iv, data: usesRandomIV ? iv + Array(ciphertext) : Array(ciphertext))
        } catch { throw CryptoError("encryption failed: \(error)") }
    }

    /// Decrypts `data` (IV-prefixed with a random IV).
    public func decrypt(_ encrypted: EncryptedData) throws(CryptoError) -> [UInt8] {
        var iv = Self.staticIV
        var ciphertext = encrypted.data
        if usesRandomIV {
            guard ciphertext.count > 16 else { throw CryptoError("decryption failed: the data is too short") }
            iv = Array(ciphertext.prefix(16))
            ciphertext = Array(ciphertext.dropFirst(16))
        }
        guard !ciphertext.isEmpty, ciphertext.count % 16 == 0 else { throw CryptoError("decryption failed: not AES-CBC ciphertext") }
        do {
            return Array(try AES._CBC.decrypt(ciphertext, using: key, iv: AES._CBC.IV(ivBytes: iv)))
        } catch { throw CryptoError("decryption failed: wrong key or corrupted data") }
    }
}

/// PubNub's header-based AES-CBC cryptor (`ACRH`): AES-256-CBC, key = SHA-256 of the cipher
/// key, a random 16-byte IV carried in the `PNED` header. Interoperable with PubNub's
/// `AesCbcCryptoModule`. Not authenticated: prefer ``AESGCMCryptor`` for Tether-only apps.
public struct AESCBCCryptor: Cryptor {
    /// `"ACRH"`.
    public let identifier = "ACRH"
    private let key: SymmetricKey

    /// Creates the cryptor.
    public init(cipherKey: String) {
        key = SymmetricKey(data: Array(SHA256.hash(data: Array(cipherKey.utf8))))
    }

    /// Encrypts with a fresh random IV.
    public func encrypt(_ plaintext: [UInt8]) throws(CryptoError) -> EncryptedData {
        let iv = randomBytes(16)
        do {
            return EncryptedData(metadata: iv, data: Array(try AES._CBC.encrypt(plaintext, using: key, iv: AES._CBC.IV(ivBytes: iv))))
        } catch { throw CryptoError("encryption failed: \(error)") }
    }

    /// Decrypts with the IV from the header.
    public func decrypt(_ encrypted: EncryptedData) throws(CryptoError) -> [UInt8] {
        guard encrypted.metadata.count == 16 else { throw CryptoError("decryption failed: the header does not carry a 16-byte IV") }
        guard !encrypted.data.isEmpty, encrypted.data.count % 16 == 0 else { throw CryptoError("decryption failed: not AES-CBC ciphertext") }
        do {
            return Array(try AES._CBC.decrypt(encrypted.data, using: key, iv: AES._CBC.IV(ivBytes: encrypted.metadata)))
        } catch { throw CryptoError("decryption failed: wrong key or corrupted data") }
    }
}

/// Tether's authenticated cryptor (`TGCM`): AES-256-GCM, key = SHA-256 of the cipher key, a
/// random 12-byte nonce in the `PNED` header, the 16-byte tag appended to the ciphertext, and the
/// cryptor id as associated data. A wrong key or any tampering is detected, never returns garbage.
///
/// Recommended for apps whose every client is a Tether SDK (PubNub SDKs cannot read it).
public struct AESGCMCryptor: Cryptor {
    /// `"TGCM"`.
    public let identifier = "TGCM"
    private let key: SymmetricKey

    /// Creates the cryptor.
    public init(cipherKey: String) {
        key = SymmetricKey(data: Array(SHA256.hash(data: Array(cipherKey.utf8))))
    }

    /// Encrypts and authenticates with a fresh nonce.
    public func encrypt(_ plaintext: [UInt8]) throws(CryptoError) -> EncryptedData {
        do {
            let box = try AES.GCM.seal(plaintext, using: key, nonce: AES.GCM.Nonce(), authenticating: Array(identifier.utf8))
            return EncryptedData(metadata: Array(box.nonce), data: Array(box.ciphertext) + Array(box.tag))
        } catch { throw CryptoError("encryption failed: \(error)") }
    }

    /// Verifies and decrypts.
    public func decrypt(_ encrypted: EncryptedData) throws(CryptoError) -> [UInt8] {
        guard encrypted.metadata.count == 12, encrypted.data.count >= 16 else { throw CryptoError("decryption failed: malformed AES-GCM data") }
        do {
            let box = try AES.GCM.SealedBox(nonce: AES.GCM.Nonce(data: encrypted.metadata), ciphertext: encrypted.data.dropLast(16),
                                            tag: encrypted.data.suffix(16))
            return Array(try AES.GCM.open(box, using: key, authenticating: Array(identifier.utf8)))
        } catch { throw CryptoError("decryption failed: wrong key or tampered data") }
    }
}

/// Encrypts with one cryptor and decrypts with whichever cryptor the data's `PNED` header names
/// (data without a header goes to the legacy cryptor), like PubNub's crypto modules.
///
/// Messages are encrypted as their JSON text and published as a JSON string holding the base64
/// of the result; `meta` is never encrypted, so filters keep working.
public struct CryptoModule: Sendable {
    /// The cryptor used to encrypt.
    public let encryptor: any Cryptor
    /// Every cryptor available to decrypt, including ``encryptor``.
    public let decryptors: [any Cryptor]

    /// Creates a module encrypting with `encryptor` and decrypting with it and `additionalDecryptors`.
    public init(encryptor: any Cryptor, additionalDecryptors: [any Cryptor] = []) {
        self.encryptor = encryptor
        self.decryptors = [encryptor] + additionalDecryptors
    }

    /// PubNub's legacy module: encrypts with ``LegacyCryptor`` (no header), decrypts legacy and `ACRH`.
    public static func legacy(cipherKey: String, usesRandomIV: Bool = true) -> CryptoModule {
        CryptoModule(encryptor: LegacyCryptor(cipherKey: cipherKey, usesRandomIV: usesRandomIV),
                     additionalDecryptors: [AESCBCCryptor(cipherKey: cipherKey)])
    }

    /// PubNub's AES-CBC module: encrypts with ``AESCBCCryptor`` (`PNED`/`ACRH`), decrypts `ACRH` and legacy.
    public static func aesCBC(cipherKey: String, legacyUsesRandomIV: Bool = true) -> CryptoModule {
        CryptoModule(encryptor: AESCBCCryptor(cipherKey: cipherKey),
                     additionalDecryptors: [LegacyCryptor(cipherKey: cipherKey, usesRandomIV: legacyUsesRandomIV)])
    }

    /// Tether's authenticated module: encrypts and decrypts with ``AESGCMCryptor`` only.
    public static func aesGCM(cipherKey: String) -> CryptoModule {
        CryptoModule(encryptor: AESGCMCryptor(cipherKey: cipherKey))
    }

    /// Encrypts bytes: `PNED` header + ciphertext (no header for the legacy cryptor).
    public func encrypt(_ plaintext: [UInt8]) throws(CryptoError) -> [UInt8] {
        guard !plaintext.isEmpty else { throw CryptoError("encryption failed: nothing to encrypt") }
        let encrypted = try encryptor.encrypt(plaintext)
        if encryptor.identifier == "0000" { return encrypted.data }
        return try Self.header(identifier: encryptor.identifier, metadata: encrypted.metadata) + encrypted.data
    }

    /// Decrypts bytes produced by any of ``decryptors``.
    public func decrypt(_ data: [UInt8]) throws(CryptoError) -> [UInt8] {
        let identifier: String
        let payload: EncryptedData
        if let header = try Self.parseHeader(data) {
            identifier = header.identifier
            payload = EncryptedData(metadata: header.metadata, data: Array(data[header.length...]))
        } else {
            identifier = "0000"
            payload = EncryptedData(metadata: [], data: data)
        }
        guard !payload.data.isEmpty else { throw CryptoError("decryption failed: no ciphertext") }
        guard let cryptor = decryptors.first(where: { $0.identifier == identifier }) else {
            throw CryptoError("decryption failed: no cryptor for \(String(reflecting: identifier))")
        }
        return try cryptor.decrypt(payload)
    }

    /// Encrypts a message: its JSON text, encrypted, as a base64 JSON string.
    public func encrypt(message: JSONValue) throws(CryptoError) -> JSONValue {
        .string(Base64.encode(try encrypt(message.jsonBytes)))
    }

    /// Decrypts a message published by ``encrypt(message:)`` (or a PubNub SDK): a base64 JSON
    /// string whose plaintext is JSON text (or, from some SDKs, plain text, returned as a string).
    public func decrypt(message: JSONValue) throws(CryptoError) -> JSONValue {
        guard case .string(let text) = message else { throw CryptoError("decryption failed: the message is not an encrypted string") }
        guard let bytes = Base64.decode(text), !bytes.isEmpty else { throw CryptoError("decryption failed: the message is not base64") }
        let plaintext = try decrypt(bytes)
        if let value = try? JSONValue(parsing: plaintext) { return value }
        guard let string = String(validating: plaintext, as: UTF8.self) else { throw CryptoError("decryption failed: the plaintext is not UTF-8") }
        return .string(string)
    }

    static func header(identifier: String, metadata: [UInt8]) throws(CryptoError) -> [UInt8] {
        guard identifier.utf8.count == 4 else { throw CryptoError("cryptor id must be 4 bytes") }
        guard metadata.count <= 65535 else { throw CryptoError("cryptor data is too long") }
        var header = Array("PNED".utf8) + [1] + Array(identifier.utf8)
        if metadata.count < 255 {
            header.append(UInt8(metadata.count))
        } else {
            header += [0xFF, UInt8(metadata.count >> 8), UInt8(metadata.count & 0xFF)]
        }
        return header + metadata
    }

    static func parseHeader(_ data: [UInt8]) throws(CryptoError) -> (identifier: String, metadata: [UInt8], length: Int)? {
        guard data.count >= 4, data[0..<4].elementsEqual("PNED".utf8) else { return nil }
        guard data.count >= 10 else { throw CryptoError("decryption failed: truncated header") }
        guard data[4] == 1 else { throw CryptoError("decryption failed: unknown header version \(data[4])") }
        let identifier = String(decoding: data[5..<9], as: UTF8.self)
        var length = Int(data[9])
        var offset = 10
        if length == 255 {
            guard data.count >= 12 else { throw CryptoError("decryption failed: truncated header") }
            length = Int(data[10]) << 8 | Int(data[11])
            offset = 12
        }
        guard data.count >= offset + length else { throw CryptoError("decryption failed: truncated header") }
        return (identifier, Array(data[offset..<offset + length]), offset + length)
    }
}

func randomBytes(_ count: Int) -> [UInt8] {
    var generator = SystemRandomNumberGenerator()
    return (0..<count).map { _ in UInt8.random(in: .min ... .max, using: &generator) }
}
