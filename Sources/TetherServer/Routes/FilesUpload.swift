import Foundation
import HTTPTypes
import Hummingbird
import Logging
import NIOCore
@_spi(Benchmarks) import TetherProtocol
import TetherServerCore

extension Reply {
    /// An error of the storage endpoints (upload and download), in the XML of S3's errors,
    /// since a PubNub SDK talks to them as it talks to S3: `<Error><Code>…</Code><Message>…`.
    static func storageError(_ status: HTTPResponse.Status, code: String, _ message: String) -> Response {
        func escape(_ text: String) -> String {
            text.replacingOccurrences(of: "&", with: "&amp;").replacingOccurrences(of: "<", with: "&lt;")
                .replacingOccurrences(of: ">", with: "&gt;")
        }
        let body = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>\(code)</Code><Message>\(escape(message))</Message></Error>"
        return Response(status: status, headers: [.contentType: "application/xml", .accessControlAllowOrigin: "*"],
                        body: .init(byteBuffer: ByteBuffer(string: body)))
    }
}

extension TetherResponder {
    // MARK: - Upload

    /// The upload endpoint's bounds: the form fields besides the file.
    private static let fieldBytes = 16 * 1024
    private static let formOverheadBytes = 64 * 1024

    /// `POST /v1/files/upload/{sub}/{id}` — the form the generate call returned, as
    /// `multipart/form-data` with the file last (as S3 takes it). The body is parsed as it
    /// arrives and the file streamed to a temporary object, so memory stays bounded; the object
    /// is committed only when the whole body was read and is within the size limit. Errors are
    /// S3's: 400 `EntityTooLarge`, 400 `MalformedPOSTRequest`, 403 `AccessDenied`.
    @inline(never) func uploadFile(_ request: Request, _ wire: WireRequest) async throws -> Response {
        let s = wire.segments
        guard NameRules.validateKey(s[3]), let keyset = state.keysets.keyset(subscribeKey: s[3]) else {
            return Reply.storageError(.notFound, code: "NoSuchBucket", "The specified bucket does not exist")
        }
        let settings = state.files.settings
        let bodyLimit = settings.maxBytes + Self.formOverheadBytes
        if let length = request.headers[.contentLength].flatMap({ Int($0) }), length > bodyLimit {
            return Self.tooLarge(settings.maxBytes)
        }
        guard let contentType = request.headers[.contentType], var parser = try? MultipartParser(contentType: contentType) else {
            return Reply.storageError(.badRequest, code: "MalformedPOSTRequest",
                                      "The body of your POST request is not well-formed multipart/form-data (no boundary).")
        }
        var session = UploadSession(keyset: keyset, id: s[4], service: state.files, maxBytes: settings.maxBytes)
        defer { session.abandon() }
        var received = 0
        var chunks = request.body.makeAsyncIterator()
        do {
            while true {
                let next: ByteBuffer?
                do {
                    next = try await chunks.next()
                } catch {
                    // The body stream failed: the client went away mid-upload. Nothing is committed.
                    return Reply.storageError(.badRequest, code: "IncompleteBody", "The request body was not received in full.")
                }
                guard let chunk = next else { break }
                received += chunk.readableBytes
                if received > bodyLimit { return Self.tooLarge(settings.maxBytes) }
                for event in try parser.feed(chunk.readableBytesView) {
                    if let refusal = try await session.handle(event, store: state.store) { return refusal }
                }
            }
            _ = try parser.finish()
        } catch let failure as MultipartParser.Failure {
            switch failure {
            case .truncated:
                return Reply.storageError(.badRequest, code: "IncompleteBody", "The request body ended before the form did.")
            default:
                return Reply.storageError(.badRequest, code: "MalformedPOSTRequest",
                                          "The body of your POST request is not well-formed multipart/form-data: \(failure).")
            }
        } catch is UploadSession.TooLarge {
            return Self.tooLarge(settings.maxBytes)
        }
        return try await session.complete(store: state.store, logger: state.logger)
    }

    static func tooLarge(_ maxBytes: Int) -> Response {
        Reply.storageError(.badRequest, code: "EntityTooLarge",
                           "Your proposed upload exceeds the maximum allowed size (\(maxBytes) bytes).")
    }

    // MARK: - Download

    /// `GET /v1/files/download/{sub}/{ch}/{id}/{name}?expires=&signature=` — the signed URL the
    /// get-file redirect names: the bytes, with the content type given at upload.
    @inline(never) func downloadFile(_ wire: WireRequest) async throws -> Response {
        let s = wire.segments
        guard NameRules.validateKey(s[3]), let keyset = state.keysets.keyset(subscribeKey: s[3]) else {
            return Reply.storageError(.notFound, code: "NoSuchBucket", "The specified bucket does not exist")
        }
        guard let expiresText = wire.query["expires"], let expires = Int64(expiresText), let signature = wire.query["signature"] else {
            return Reply.storageError(.forbidden, code: "AccessDenied", "Query-string authentication requires expires and signature.")
        }
        do {
            try state.files.verifyDownload(subscribeKey: keyset.subscribeKey, id: s[5], expires: expires, signature: signature,
                                           now: FileService.now())
        } catch .expired {
            return Reply.storageError(.forbidden, code: "AccessDenied", "Request has expired")
        } catch {
            return Reply.storageError(.forbidden, code: "SignatureDoesNotMatch", "The request signature does not match.")
        }
        let storage = state.files.storage
        guard let file = try await state.store.file(subscribeKey: keyset.subscribeKey, id: s[5]), file.channel == s[4], file.name == s[6],
              let size = try storage.size(key: file.storageKey)
        else { return Reply.storageError(.notFound, code: "NoSuchKey", "The specified key does not exist.") }
        var headers: HTTPFields = [
            .contentType: file.contentType,
            .accessControlAllowOrigin: "*",
            .cacheControl: "private, max-age=3600",
        ]
        headers[.contentDisposition] = "attachment; filename*=UTF-8''\(PercentCoding.encode(file.name))"
        // Served in 64 KiB pieces, so a large file never sits whole in memory. A file deleted
        // mid-way aborts the connection (the client sees a short body), never wrong bytes.
        let key = file.storageKey
        let body = ResponseBody(contentLength: size) { writer in
            var offset = 0
            while offset < size {
                let piece = try storage.read(key: key, offset: offset, count: min(64 * 1024, size - offset))
                guard !piece.isEmpty else { throw CocoaError(.fileReadUnknown) }
                try await writer.write(ByteBuffer(bytes: piece))
                offset += piece.count
            }
            try await writer.finish(nil)
        }
        return Response(status: .ok, headers: headers, body: body)
    }
}


/// One upload's progress through the form: the fields before the file, the file streamed to
/// a storage upload, then the commit. Any path out other than ``complete(store:logger:)``
/// leaves nothing (``abandon()`` aborts the write and releases the id).
private struct UploadSession {
    struct TooLarge: Error {}
    /// A storage write that failed (disk full, permissions): a server error, not the client's.
    struct WriteFailed: Error { var cause: any Error }

    let keyset: Keyset
    let id: String
    let service: FileService
    let maxBytes: Int
    private var fields: [String: String] = [:]
    private var fieldBytes = 0
    /// The form field being read.
    private var field: (name: String, bytes: [UInt8])?
    private var upload: (any FileStorageUpload)?
    private var policy: FileUploadPolicy?
    private var claimed = false
    private var fileContentType = "application/octet-stream"
    private var size = 0
    private var inFile = false
    private var fileDone = false

    init(keyset: Keyset, id: String, service: FileService, maxBytes: Int) {
        self.keyset = keyset
        self.id = id
        self.service = service
        self.maxBytes = maxBytes
    }

    private var key: String { StoredFile.storageKey(subscribeKey: keyset.subscribeKey, id: id) }

    /// Handles one parser event; a response when the upload is refused.
    mutating func handle(_ event: MultipartParser.Event, store: MessageStore) async throws -> Response? {
        switch event {
        case .partStart(let headers):
            if fileDone { return nil }  // fields after the file are ignored, as S3 ignores them
            if headers.filename != nil || headers.name == "file" {
                return try await startFile(headers, store: store)
            }
            field = (headers.name, [])
        case .body(let bytes):
            if inFile {
                size += bytes.count
                if size > maxBytes { throw TooLarge() }
                do { try upload?.write(bytes) } catch { throw WriteFailed(cause: error) }
            } else if field != nil {
                fieldBytes += bytes.count
                guard fieldBytes <= 16 * 1024 else {
                    return Reply.storageError(.badRequest, code: "MalformedPOSTRequest", "The form fields are too large.")
                }
                field?.bytes += bytes
            }
        case .partEnd:
            if inFile {
                inFile = false
                fileDone = true
            } else if let (name, bytes) = field {
                guard let text = String(validating: bytes, as: UTF8.self) else {
                    return Reply.storageError(.badRequest, code: "MalformedPOSTRequest", "A form field is not UTF-8.")
                }
                fields[name] = text
                field = nil
            }
        case .end:
            break
        }
        return nil
    }

    private mutating func startFile(_ headers: MultipartParser.PartHeaders, store: MessageStore) async throws -> Response? {
        guard let encoded = fields["Policy"], let signature = fields["X-Tether-Signature"] else {
            return Reply.storageError(.forbidden, code: "AccessDenied", "Invalid according to Policy: the form has no Policy or signature.")
        }
        let policy: FileUploadPolicy
        do {
            policy = try service.verifyUpload(policy: encoded, signature: signature, now: FileService.now())
        } catch .expired {
            return Reply.storageError(.forbidden, code: "AccessDenied", "Invalid according to Policy: Policy expired.")
        } catch {
            return Reply.storageError(.forbidden, code: "AccessDenied", "Invalid according to Policy: the signature does not match.")
        }
        guard policy.subscribeKey == keyset.subscribeKey, policy.id == id else {
            return Reply.storageError(.forbidden, code: "AccessDenied", "Invalid according to Policy: the form is for another file.")
        }
        // One upload per id: none stored, none in progress.
        guard service.claim(key) else {
            return Reply.storageError(.conflict, code: "OperationAborted", "An upload of this file is already in progress.")
        }
        claimed = true
        if try await store.file(subscribeKey: keyset.subscribeKey, id: id) != nil {
            return Reply.storageError(.conflict, code: "OperationAborted", "This upload form was already used.")
        }
        self.policy = policy
        fileContentType = fields["Content-Type"].flatMap { $0.isEmpty ? nil : $0 } ?? headers.contentType
            ?? FileService.contentType(forName: policy.name)
        do { upload = try service.storage.put(key: key) } catch { throw WriteFailed(cause: error) }
        inFile = true
        return nil
    }

    /// The whole body was read: commit the bytes, then record the file. 204, as S3 answers.
    mutating func complete(store: MessageStore, logger: Logger) async throws -> Response {
        guard fileDone, let upload, let policy else {
            return Reply.storageError(.badRequest, code: "InvalidArgument", "POST requires exactly one file upload per request.")
        }
        self.upload = nil
        do { try upload.commit() } catch { throw WriteFailed(cause: error) }
        let file = StoredFile(subscribeKey: keyset.subscribeKey, channel: policy.channel, id: id, name: policy.name, size: size,
                              contentType: fileContentType, created: LongPollHub.systemNow())
        let added: Bool
        do {
            added = try await store.addFile(file)
        } catch {
            try? service.storage.delete(key: key)
            throw error
        }
        guard added else {
            try? service.storage.delete(key: key)
            return Reply.storageError(.conflict, code: "OperationAborted", "This upload form was already used.")
        }
        logger.debug("file uploaded", metadata: ["key": "\(key)", "size": "\(size)"])
        return Response(status: .noContent, headers: [.accessControlAllowOrigin: "*"])
    }

    /// Aborts an unfinished write and releases the id.
    mutating func abandon() {
        upload?.abort()
        upload = nil
        if claimed {
            service.release(key)
            claimed = false
        }
    }
}
