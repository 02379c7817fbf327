public import Foundation
public import TetherClientCore
public import TetherProtocol

/// How far a file transfer has come.
public struct FileTransferProgress: Sendable, Hashable {
    /// Bytes sent or received so far.
    public var completedBytes: Int
    /// The transfer's size in bytes.
    public var totalBytes: Int

    /// Creates a progress report.
    public init(completedBytes: Int, totalBytes: Int) {
        self.completedBytes = completedBytes
        self.totalBytes = totalBytes
    }

    /// `completedBytes / totalBytes`, 1 for an empty transfer.
    public var fraction: Double { totalBytes == 0 ? 1 : Double(completedBytes) / Double(totalBytes) }
}

extension TetherClient {
    /// Uploads `data` as the file `name` on `channel` and announces it with a file message
    /// (message type 4, carrying `message`), as PubNub's `sendFile` does: the server hands out
    /// a one-time upload form, the bytes go to it, then the file message is published.
    ///
    /// With ``TetherConfiguration/cryptoModule`` set, the bytes and the file message are
    /// encrypted. `progress` is told when the upload starts, as the file's bytes are sent (in
    /// 64 KiB pieces, with the built-in HTTP transport), and when the server has them. Errors are statuses: ``StatusCategory/badRequest``
    /// for a file over the server's size limit (S3's `EntityTooLarge`) or a bad name,
    /// ``StatusCategory/accessDenied`` without the write permission.
    /// - Returns: the file's id and name and the file message's timetoken.
    public func sendFile(channel: String, data: [UInt8], name: String, message: JSONValue? = nil, contentType: String? = nil,
                         storeInHistory: Bool = true, progress: (@Sendable (FileTransferProgress) -> Void)? = nil,
                         timeout: Duration? = nil) async throws(TetherError) -> SentFile
    {
        let form = try await perform(.sendFile, channels: [channel], build: { e throws(RequestBuildError) in
            try e.generateFileUpload(channel: channel, name: name, timeout: timeout)
        }, decode: ResponseDecoding.fileUploadForm)
        var bytes = data
        if let module = configuration.cryptoModule {
            do { bytes = try module.encrypt(data) } catch {
                throw TetherError(Status(category: .badRequest, operation: .sendFile, error: error, serverMessage: error.description,
                                         affectedChannels: [channel]))
            }
        }
        var boundary = "tether-" + UUID().uuidString
        while !MultipartFormBuilder.isUsable(boundary, for: bytes) { boundary = "tether-" + UUID().uuidString }
        let (body, formType) = MultipartFormBuilder.build(fields: form.fields, fileName: form.name, contentType: contentType,
                                                          data: bytes, boundary: boundary)
        progress?(FileTransferProgress(completedBytes: 0, totalBytes: bytes.count))
        let request = TransportRequest(url: form.url, method: .post, headers: ["Content-Type": formType, "User-Agent": "Tether-Swift/0.1"],
                                       body: body, timeout: timeout ?? Self.uploadTimeout(bytes: body.count, base: configuration.nonSubscribeTimeout))
        // Progress counts the file's bytes: the form's own bytes before and after it are not.
        let fileStart = body.count - bytes.count - "\r\n--\(boundary)--\r\n".utf8.count, fileSize = bytes.count
        let response = try await sendFileRequest(request, operation: .sendFile, channel: channel, sent: progress.map { report in
            { @Sendable sentBytes in
                let done = min(max(sentBytes - fileStart, 0), fileSize)
                if done > 0 && done < fileSize { report(FileTransferProgress(completedBytes: done, totalBytes: fileSize)) }
            }
        })
        guard (200..<300).contains(response.statusCode) else { throw fileFailure(response, operation: .sendFile, channel: channel) }
        progress?(FileTransferProgress(completedBytes: bytes.count, totalBytes: bytes.count))
        // The file is on the server; unannounced, nobody would know of it. Its file message
        // carries a request id, so it is sent again on a transient failure (up to 3 attempts in
        // all, as PubNub's SDKs retry it) and stored once; if it still fails, the status says
        // so and its `retry()` announces the file with the same id.
        let requestID = UUID().uuidString
        var attempt = 1
        while true {
            do {
                let timetoken = try await publishFileMessage(channel: channel, fileId: form.id, fileName: form.name, message: message,
                                                             storeInHistory: storeInHistory, requestID: requestID, timeout: timeout)
                return SentFile(id: form.id, name: form.name, timetoken: timetoken)
            } catch {
                guard attempt >= Self.fileMessageAttempts || !RetryConfiguration.isTransient(error.status) else {
                    attempt += 1
                    continue
                }
                var status = error.status
                status.requestId = requestID
                status.serverMessage = "the file was uploaded (id \(form.id), name \(String(reflecting: form.name))) but its file message "
                    + "was not published: \(status.serverMessage ?? status.error.map { "\($0)" } ?? "\(status.category)"); "
                    + "status.retry() or publishFileMessage(channel:fileId:fileName:) announces it"
                throw TetherError(status)
            }
        }
    }

    /// An upload's deadline when the call gives none: the non-subscribe timeout, plus a second
    /// for every 64 KiB (a 5 MiB file gets 80 s more), so a large file over a slow uplink is not
    /// cut off at 15 s.
    static func uploadTimeout(bytes: Int, base: Duration) -> Duration {
        base + .seconds(bytes / 65_536)
    }

    /// Attempts at a file message after its upload (PubNub's SDKs retry it too).
    static let fileMessageAttempts = 3

    /// ``sendFile(channel:data:name:message:contentType:storeInHistory:progress:timeout:)`` with
    /// the bytes of a local file (its last path component is the name unless `name` is given).
    public func sendFile(channel: String, fileURL: URL, name: String? = nil, message: JSONValue? = nil, contentType: String? = nil,
                         storeInHistory: Bool = true, progress: (@Sendable (FileTransferProgress) -> Void)? = nil,
                         timeout: Duration? = nil) async throws(TetherError) -> SentFile
    {
        let data: Data
        do { data = try Data(contentsOf: fileURL) } catch {
            throw TetherError(Status(category: .badRequest, operation: .sendFile, error: error,
                                     serverMessage: "cannot read \(fileURL.path): \(error.localizedDescription)", affectedChannels: [channel]))
        }
        return try await sendFile(channel: channel, data: Array(data), name: name ?? fileURL.lastPathComponent, message: message,
                                  contentType: contentType, storeInHistory: storeInHistory, progress: progress, timeout: timeout)
    }

    /// Publishes the file message for a file already uploaded (what ``sendFile(channel:data:name:message:contentType:storeInHistory:progress:timeout:)``
    /// does after the upload; use it to announce a file again).
    /// - Returns: the file message's timetoken.
    public func publishFileMessage(channel: String, fileId: String, fileName: String, message: JSONValue? = nil,
                                   storeInHistory: Bool = true, timeout: Duration? = nil) async throws(TetherError) -> Timetoken
    {
        try await publishFileMessage(channel: channel, fileId: fileId, fileName: fileName, message: message,
                                     storeInHistory: storeInHistory, requestID: UUID().uuidString, timeout: timeout)
    }

    /// ``publishFileMessage(channel:fileId:fileName:message:storeInHistory:timeout:)`` with the
    /// request id it is sent with (each of its attempts, and its status's `retry()`).
    func publishFileMessage(channel: String, fileId: String, fileName: String, message: JSONValue?, storeInHistory: Bool,
                            requestID: String, timeout: Duration?) async throws(TetherError) -> Timetoken
    {
        var text = Endpoints.fileMessage(id: fileId, name: fileName, message: message).jsonText
        if let module = configuration.cryptoModule {
            do { text = try module.encrypt(message: Endpoints.fileMessage(id: fileId, name: fileName, message: message)).jsonText } catch {
                throw TetherError(Status(category: .badRequest, operation: .publishFileMessage, error: error,
                                         serverMessage: error.description, affectedChannels: [channel]))
            }
        }
        let result = try await perform(.publishFileMessage, channels: [channel], build: { e throws(RequestBuildError) in
            try e.publishFileMessage(channel: channel, messageJSON: text, storeInHistory: storeInHistory, requestID: requestID,
                                     timeout: timeout)
        }, decode: ResponseDecoding.publish)
        return result.timetoken
    }

    /// One page of a channel's files, oldest first (`limit` 1–100); pass the page's
    /// ``FilesPage/next`` for the next one.
    public func listFiles(channel: String, limit: Int = 100, next: String? = nil, timeout: Duration? = nil) async throws(TetherError)
        -> FilesPage
    {
        try await perform(.listFiles, channels: [channel], build: { e throws(RequestBuildError) in
            try e.listFiles(channel: channel, limit: limit, next: next, timeout: timeout)
        }, decode: ResponseDecoding.filesPage)
    }

    /// Downloads a file: the server answers with a redirect to a signed URL, whose bytes are
    /// returned (decrypted when ``TetherConfiguration/cryptoModule`` is set). `progress` is told
    /// as the bytes arrive and when they all have. An unknown file fails with status code 404;
    /// the built-in HTTP transport takes responses of up to 32 MiB.
    /// - Returns: the bytes and their content type.
    public func downloadFile(channel: String, fileId: String, fileName: String,
                             progress: (@Sendable (FileTransferProgress) -> Void)? = nil, timeout: Duration? = nil)
        async throws(TetherError) -> (data: [UInt8], contentType: String?)
    {
        let spec: RequestSpec
        do { spec = try endpoints.file(.downloadFile, channel: channel, id: fileId, name: fileName, timeout: timeout) } catch {
            throw TetherError(Status(category: .badRequest, operation: .downloadFile, error: error, serverMessage: error.description,
                                     affectedChannels: [channel]))
        }
        let wait = timeout ?? configuration.nonSubscribeTimeout
        let redirect = try await sendFileRequest(TransportRequest(url: configuration.baseURL(of: origins.next()) + signedTarget(spec), method: .get,
                                                                  headers: ["User-Agent": "Tether-Swift/0.1"], timeout: wait),
                                                 operation: .downloadFile, channel: channel)
        guard (300..<400).contains(redirect.statusCode),
              let location = redirect.headers.first(where: { $0.key.lowercased() == "location" })?.value
        else { throw fileFailure(redirect, operation: .downloadFile, channel: channel) }
        let response = try await sendFileRequest(TransportRequest(url: location, method: .get, headers: ["User-Agent": "Tether-Swift/0.1"],
                                                                  timeout: wait),
                                                 operation: .downloadFile, channel: channel, received: progress.map { report in
            { @Sendable (done: Int, total: Int?) in
                if let total, done < total { report(FileTransferProgress(completedBytes: done, totalBytes: total)) }
            }
        })
        guard response.statusCode == 200 else { throw fileFailure(response, operation: .downloadFile, channel: channel) }
        progress?(FileTransferProgress(completedBytes: response.body.count, totalBytes: response.body.count))
        var bytes = response.body
        if let module = configuration.cryptoModule {
            do { bytes = try module.decrypt(bytes) } catch {
                throw TetherError(Status(category: .decryptionError, operation: .downloadFile, error: error,
                                         serverMessage: error.description, affectedChannels: [channel]))
            }
        }
        return (bytes, response.headers.first(where: { $0.key.lowercased() == "content-type" })?.value)
    }

    /// Deletes a file: its bytes and its entry in the list. The file message that announced it
    /// stays in history. An unknown file fails with status code 404.
    public func deleteFile(channel: String, fileId: String, fileName: String, timeout: Duration? = nil) async throws(TetherError) {
        try await perform(.deleteFile, channels: [channel], build: { e throws(RequestBuildError) in
            try e.file(.deleteFile, channel: channel, id: fileId, name: fileName, timeout: timeout)
        }, decode: { _ in () })
    }

    // MARK: - Transport

    /// The request target, signed when a secret key is configured.
    private func signedTarget(_ spec: RequestSpec) -> String {
        var signed = spec
        if let secret = configuration.secretKey, !secret.isEmpty {
            let text = RequestSigning.prepare(&signed, publishKey: configuration.publishKey ?? "", unixSeconds: Int64(Date().timeIntervalSince1970))
            signed.append("signature", Self.signature(of: text, secretKey: secret))
        }
        return signed.target
    }

    /// Sends through the transport; with the built-in HTTP transport, body progress is reported
    /// as the connection takes and delivers the bytes (another transport reports start and end).
    private func sendFileRequest(_ request: TransportRequest, operation: TetherOperation, channel: String,
                                 sent: (@Sendable (Int) -> Void)? = nil, received: (@Sendable (Int, Int?) -> Void)? = nil)
        async throws(TetherError) -> TransportResponse
    {
        do {
            if let http = transport as? HTTPClientTransport, sent != nil || received != nil {
                return try await http.send(request, sent: sent, received: received)
            }
            return try await transport.send(request)
        } catch {
            throw TetherError(Status(category: error.category, operation: operation, error: error, affectedChannels: [channel]))
        }
    }

    /// A status for a failed storage or redirect response (S3-style XML bodies included).
    private func fileFailure(_ response: TransportResponse, operation: TetherOperation, channel: String) -> TetherError {
        let text = String(decoding: response.body.prefix(2048), as: UTF8.self)
        switch ResponseClassifier.classify(statusCode: response.statusCode, body: response.body) {
        case .failure(let category, let details):
            let code = Self.xmlElement("Code", in: text)
            let message = details.message ?? Self.xmlElement("Message", in: text).map { m in code.map { "\($0): \(m)" } ?? m } ?? text
            // A storage answers in XML: its 403 (an expired or foreign upload form) is a refusal.
            let category = response.statusCode == 403 ? .accessDenied : category
            return TetherError(Status(category: category == .malformedResponse && response.statusCode >= 400 ? .unknown : category,
                                      operation: operation, statusCode: response.statusCode, serverMessage: message,
                                      affectedChannels: [channel]))
        case .success:
            return TetherError(Status(category: .malformedResponse, operation: operation, statusCode: response.statusCode,
                                      serverMessage: "unexpected answer \(response.statusCode)", affectedChannels: [channel]))
        }
    }

    private static func xmlElement(_ name: String, in text: String) -> String? {
        guard let open = text.range(of: "<\(name)>"), let close = text.range(of: "</\(name)>", range: open.upperBound..<text.endIndex) else {
            return nil
        }
        return String(text[open.upperBound..<close.lowerBound])
    }
}
