public import TetherProtocol

/// A file stored on a channel (one row of a file list).
public struct FileInfo: Sendable, Hashable {
    /// The id the server gave the file.
    public var id: String
    /// Its name.
    public var name: String
    /// Its size in bytes (as stored: encrypted files are larger than their plaintext).
    public var size: Int
    /// When it was uploaded, ISO 8601 (`2026-01-02T03:04:05Z`).
    public var created: String

    /// Creates a file description.
    public init(id: String, name: String, size: Int, created: String) {
        self.id = id
        self.name = name
        self.size = size
        self.created = created
    }
}

/// One page of a channel's files, oldest first.
public struct FilesPage: Sendable, Hashable {
    /// The files.
    public var files: [FileInfo]
    /// The cursor of the next page, `nil` on the last one.
    public var next: String?

    /// Creates a page.
    public init(files: [FileInfo], next: String?) {
        self.files = files
        self.next = next
    }
}

/// A file that was uploaded and announced.
public struct SentFile: Sendable, Hashable {
    /// The file's id.
    public var id: String
    /// The file's name.
    public var name: String
    /// The timetoken of the file message that announced it.
    public var timetoken: Timetoken

    /// Creates a result.
    public init(id: String, name: String, timetoken: Timetoken) {
        self.id = id
        self.name = name
        self.timetoken = timetoken
    }
}

/// A file message received on a subscription (message type 4).
public struct FileEvent: Sendable, Hashable {
    /// The file's id.
    public var fileId: String
    /// The file's name.
    public var fileName: String
    /// The message sent with the file, if any.
    public var message: JSONValue?
    /// The channel.
    public var channel: String
    /// Who sent it.
    public var publisher: String?
    /// The file message's timetoken.
    public var timetoken: Timetoken

    /// Creates an event.
    public init(fileId: String, fileName: String, message: JSONValue?, channel: String, publisher: String?, timetoken: Timetoken) {
        self.fileId = fileId
        self.fileName = fileName
        self.message = message
        self.channel = channel
        self.publisher = publisher
        self.timetoken = timetoken
    }
}

extension ReceivedEvent {
    /// The file this event announces, when it is a file message (``kind`` is ``EventKind/file``
    /// and the payload is `{"message":…,"file":{"id","name"}}`).
    public var file: FileEvent? {
        guard kind == .file, let file = payload["file"], let id = file["id"]?.stringValue, let name = file["name"]?.stringValue else {
            return nil
        }
        var message: JSONValue?
        if let value = payload["message"], !value.isNull { message = value }
        return FileEvent(fileId: id, fileName: name, message: message, channel: channel, publisher: publisher, timetoken: timetoken)
    }
}

/// What the generate-upload-url call answered: the file's id and the form to upload it with.
package struct FileUploadForm: Sendable, Hashable {
    package var id: String
    package var name: String
    /// Where to POST the form (absolute).
    package var url: String
    /// The form fields, in order, before the file.
    package var fields: [(key: String, value: String)]

    package static func == (a: Self, b: Self) -> Bool {
        a.id == b.id && a.name == b.name && a.url == b.url && a.fields.map(\.key) == b.fields.map(\.key)
            && a.fields.map(\.value) == b.fields.map(\.value)
    }

    package func hash(into hasher: inout Hasher) {
        hasher.combine(id)
        hasher.combine(url)
    }
}

/// Builds a `multipart/form-data` body (RFC 7578): the fields, then the file part last, as
/// S3-style upload endpoints require.
package enum MultipartFormBuilder {
    /// The body and its `Content-Type`. `boundary` must not occur in the data; pass a fresh
    /// random one (a UUID) — ``boundary(avoiding:seed:)`` checks it.
    package static func build(fields: [(key: String, value: String)], fileField: String = "file", fileName: String,
                              contentType: String?, data: [UInt8], boundary: String) -> (body: [UInt8], contentType: String) {
        var body: [UInt8] = []
        body.reserveCapacity(data.count + 512 + fields.reduce(0) { $0 + $1.key.utf8.count + $1.value.utf8.count + 80 })
        func quoted(_ text: String) -> String {
            text.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "\"", with: "\\\"")
                .replacingOccurrences(of: "\r", with: " ").replacingOccurrences(of: "\n", with: " ")
        }
        for field in fields {
            body += Array("--\(boundary)\r\nContent-Disposition: form-data; name=\"\(quoted(field.key))\"\r\n\r\n".utf8)
            body += Array(field.value.utf8)
            body += Array("\r\n".utf8)
        }
        body += Array("--\(boundary)\r\nContent-Disposition: form-data; name=\"\(quoted(fileField))\"; filename=\"\(quoted(fileName))\"\r\n".utf8)
        body += Array("Content-Type: \(contentType ?? "application/octet-stream")\r\n\r\n".utf8)
        body += data
        body += Array("\r\n--\(boundary)--\r\n".utf8)
        return (body, "multipart/form-data; boundary=\(boundary)")
    }

    /// Whether `boundary` is usable for `data`: 1–70 characters and absent from the data.
    package static func isUsable(_ boundary: String, for data: [UInt8]) -> Bool {
        let needle = Array(boundary.utf8)
        guard (1...70).contains(needle.count) else { return false }
        guard data.count >= needle.count else { return true }
        var i = 0
        while i + needle.count <= data.count {
            if data[i] == needle[0], Array(data[i..<(i + needle.count)]) == needle { return false }
            i += 1
        }
        return true
    }
}

extension Endpoints {
    private var filesBase: String { "/v1/files/\(PercentCoding.encode(context.subscribeKey))/channels" }

    /// `POST /v1/files/{sub}/channels/{ch}/generate-upload-url` with `{"name":"…"}`.
    package func generateFileUpload(channel: String, name: String, timeout: Duration? = nil) throws(RequestBuildError) -> RequestSpec {
        try Self.check(channel: channel)
        guard !name.isEmpty, name.utf8.count <= 255 else { throw .invalidArgument("a file name is 1–255 bytes") }
        var w = JSONWriter()
        w.raw("{\"name\":")
        w.string(name)
        w.raw("}")
        var spec = RequestSpec(operation: .sendFile, method: .post, path: "\(filesBase)/\(PercentCoding.encode(channel))/generate-upload-url",
                               body: w.bytes, timeout: timeout)
        appendFilesCommon(&spec)
        return spec
    }

    /// `GET /v1/files/{sub}/channels/{ch}/files` with `limit` (1–100) and `next`.
    package func listFiles(channel: String, limit: Int, next: String?, timeout: Duration? = nil) throws(RequestBuildError) -> RequestSpec {
        try Self.check(channel: channel)
        guard (1...100).contains(limit) else { throw .invalidArgument("limit must be 1–100") }
        var spec = RequestSpec(operation: .listFiles, path: "\(filesBase)/\(PercentCoding.encode(channel))/files", timeout: timeout)
        spec.append("limit", String(limit))
        if let next, !next.isEmpty { spec.append("next", next) }
        appendFilesCommon(&spec)
        return spec
    }

    /// `GET` (the download redirect) or `DELETE` `/v1/files/{sub}/channels/{ch}/files/{id}/{name}`.
    package func file(_ operation: TetherOperation, channel: String, id: String, name: String, timeout: Duration? = nil)
        throws(RequestBuildError) -> RequestSpec
    {
        try Self.check(channel: channel)
        guard !id.isEmpty, !name.isEmpty else { throw .invalidArgument("a file needs its id and name") }
        var spec = RequestSpec(operation: operation, method: operation == .deleteFile ? .delete : .get,
                               path: "\(filesBase)/\(PercentCoding.encode(channel))/files/\(PercentCoding.encode(id))/\(PercentCoding.encode(name))",
                               timeout: timeout)
        appendFilesCommon(&spec)
        return spec
    }

    /// `GET /v1/files/publish-file/{pub}/{sub}/0/{ch}/0/{message}` where the message is
    /// `{"message":…,"file":{"id","name"}}` (or that object encrypted, as `messageJSON`).
    /// The file message's publish, with `requestID` (the server stores one file message per id
    /// within its dedup window, so the call may be sent again after any failure).
    package func publishFileMessage(channel: String, messageJSON: String, storeInHistory: Bool, requestID: String? = nil,
                                    timeout: Duration? = nil) throws(RequestBuildError) -> RequestSpec
    {
        guard let pub = context.publishKey, !pub.isEmpty else { throw .missingPublishKey }
        try Self.check(channel: channel)
        var spec = RequestSpec(operation: .publishFileMessage,
                               path: "/v1/files/publish-file/\(PercentCoding.encode(pub))/\(PercentCoding.encode(context.subscribeKey))/0/"
                                   + "\(PercentCoding.encode(channel))/0/\(PercentCoding.encode(messageJSON))", timeout: timeout)
        spec.append("store", storeInHistory ? "1" : "0")
        if let requestID { spec.append("requestid", requestID) }
        appendFilesCommon(&spec)
        return spec
    }

    /// The file message `{"message":…,"file":{"id","name"}}` as PubNub SDKs publish it.
    package static func fileMessage(id: String, name: String, message: JSONValue?) -> JSONValue {
        .object(["message": message ?? .null, "file": .object(["id": .string(id), "name": .string(name)])])
    }

    private func appendFilesCommon(_ spec: inout RequestSpec) {
        spec.append("uuid", context.userId)
        spec.append("pnsdk", context.sdkName)
        spec.carriesAuth = true
        if let key = context.authKey, !key.isEmpty { spec.append("auth", key) }
    }
}

extension ResponseDecoding {
    /// Generate upload URL → `{"data":{"id","name"},"file_upload_request":{"url","form_fields":[{key,value}]}}`.
    package static func fileUploadForm(_ body: JSONValue) throws(DecodingFailure) -> FileUploadForm {
        guard let id = body["data"]?["id"]?.stringValue, let name = body["data"]?["name"]?.stringValue,
              let request = body["file_upload_request"], let url = request["url"]?.stringValue,
              let items = request["form_fields"]?.arrayValue
        else { throw DecodingFailure("generate upload url: expected data and file_upload_request") }
        var fields: [(key: String, value: String)] = []
        for item in items {
            guard let key = item["key"]?.stringValue, let value = item["value"]?.stringValue else {
                throw DecodingFailure("generate upload url: a form field without key or value")
            }
            fields.append((key, value))
        }
        return FileUploadForm(id: id, name: name, url: url, fields: fields)
    }

    /// List files → `{"data":[{"id","name","size","created"}],"next":…}`.
    package static func filesPage(_ body: JSONValue) throws(DecodingFailure) -> FilesPage {
        guard let items = body["data"]?.arrayValue else { throw DecodingFailure("list files: expected a data list") }
        var files: [FileInfo] = []
        for item in items {
            guard let id = item["id"]?.stringValue, let name = item["name"]?.stringValue else {
                throw DecodingFailure("list files: a file without id or name")
            }
            files.append(FileInfo(id: id, name: name, size: item["size"]?.intValue ?? 0, created: item["created"]?.stringValue ?? ""))
        }
        return FilesPage(files: files, next: body["next"]?.stringValue)
    }
}
