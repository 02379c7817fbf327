import CZlib

/// Inflates publish bodies sent with `Content-Encoding: gzip` or `deflate`.
///
/// PubNub's Python SDK labels a zlib stream as gzip (pubnub-wire §1.3), so this accepts gzip,
/// zlib and raw deflate whatever the label says, and stops at `limit` bytes of output so a
/// compression bomb cannot exhaust memory.
enum Decompression {
    enum Failure: Error {
        case invalidData
        case tooLarge
    }

    static func inflate(_ input: [UInt8], limit: Int) throws(Failure) -> [UInt8] {
        // 15 + 32: zlib or gzip, detected from the header; -15: raw deflate.
        if let result = try attempt(input, windowBits: 15 + 32, limit: limit) { return result }
        if let result = try attempt(input, windowBits: -15, limit: limit) { return result }
        throw .invalidData
    }

    private static func attempt(_ input: [UInt8], windowBits: Int32, limit: Int) throws(Failure) -> [UInt8]? {
        var stream = z_stream()
        guard inflateInit2_(&stream, windowBits, ZLIB_VERSION, Int32(MemoryLayout<z_stream>.size)) == Z_OK else { return nil }
        defer { inflateEnd(&stream) }
        var output: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 16 * 1024)
        var input = input
        var status: Int32 = Z_OK
        var tooLarge = false
        input.withUnsafeMutableBufferPointer { inputBuffer in
            stream.next_in = inputBuffer.baseAddress
            stream.avail_in = UInt32(inputBuffer.count)
            repeat {
                chunk.withUnsafeMutableBufferPointer { chunkBuffer in
                    stream.next_out = chunkBuffer.baseAddress
                    stream.avail_out = UInt32(chunkBuffer.count)
                    status = CZlib.inflate(&stream, Z_NO_FLUSH)
                    let produced = chunkBuffer.count - Int(stream.avail_out)
                    output.append(contentsOf: chunkBuffer[0..<produced])
                }
                if output.count > limit {
                    tooLarge = true
                    return
                }
            } while status == Z_OK && (stream.avail_in > 0 || stream.avail_out == 0)
        }
        if tooLarge { throw .tooLarge }
        guard status == Z_STREAM_END else { return nil }
        return output
    }
}
