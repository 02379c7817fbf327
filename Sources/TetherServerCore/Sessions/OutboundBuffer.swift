/// The frames waiting to be written to one WebSocket, bounded in count and bytes: a client that
/// does not read fast enough fills it, and the next frame overflows it — the connection is closed
/// as a slow consumer (its session is kept, and resumes from its cursor). Pure: the shell's
/// queue wraps it in a lock.
package struct OutboundBuffer<Element: Sendable>: Sendable {
    package enum Push: Sendable, Hashable {
        case queued
        /// Over the bound: nothing was added, and nothing more will be (`isOverflowed`).
        case overflow
    }

    package let maxFrames: Int
    package let maxBytes: Int
    private var frames: [(element: Element, bytes: Int)] = []
    private var head = 0
    package private(set) var byteCount = 0
    package private(set) var isOverflowed = false

    package init(maxFrames: Int, maxBytes: Int) {
        self.maxFrames = max(1, maxFrames)
        self.maxBytes = max(1, maxBytes)
    }

    package var count: Int { frames.count - head }
    package var isEmpty: Bool { count == 0 }

    /// Adds a frame of `bytes` bytes; a frame that would pass either bound overflows the buffer.
    /// One frame larger than `maxBytes` is accepted into an empty buffer (the frame-size limit
    /// bounds it), so a big message cannot wedge a reader that keeps up.
    package mutating func push(_ element: Element, bytes: Int) -> Push {
        guard !isOverflowed else { return .overflow }
        if count >= maxFrames || (count > 0 && byteCount + bytes > maxBytes) {
            isOverflowed = true
            return .overflow
        }
        frames.append((element, bytes))
        byteCount += bytes
        return .queued
    }

    /// Takes the oldest frame.
    package mutating func pop() -> Element? {
        guard head < frames.count else { return nil }
        let (element, bytes) = frames[head]
        head += 1
        byteCount -= bytes
        if head == frames.count {
            frames.removeAll(keepingCapacity: true)
            head = 0
        } else if head > 64, head * 2 > frames.count {
            frames.removeFirst(head)
            head = 0
        }
        return element
    }
}
