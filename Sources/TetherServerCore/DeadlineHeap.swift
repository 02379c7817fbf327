/// What a ``DeadlineHeap`` orders: an entry due at `at`.
@usableFromInline protocol DeadlineEntry {
    associatedtype Instant: Comparable
    var at: Instant { get }
}

/// A binary min-heap of deadlines ordered by `at`. Stale entries are skipped when popped (or
/// dropped by ``rebuild(keeping:)``), so a push costs `O(log n)` and nothing is ever searched.
@usableFromInline struct DeadlineHeap<Entry: DeadlineEntry> {
    @usableFromInline var items: [Entry] = []

    @inlinable init() {}

    @inlinable var first: Entry? { items.first }
    @inlinable var count: Int { items.count }

    @inlinable mutating func push(_ element: Entry) {
        items.append(element)
        var child = items.count - 1
        while child > 0 {
            let parent = (child - 1) / 2
            guard items[child].at < items[parent].at else { break }
            items.swapAt(child, parent)
            child = parent
        }
    }

    @inlinable mutating func popMin() {
        guard !items.isEmpty else { return }
        items.swapAt(0, items.count - 1)
        items.removeLast()
        siftDown(from: 0)
    }

    /// Keeps only the entries `isLive` accepts and restores the heap order in `O(n)`.
    @inlinable mutating func rebuild(keeping isLive: (Entry) -> Bool) {
        items.removeAll { !isLive($0) }
        var index = items.count / 2
        while index > 0 {
            index -= 1
            siftDown(from: index)
        }
    }

    @inlinable mutating func siftDown(from start: Int) {
        var parent = start
        while true {
            let left = 2 * parent + 1
            let right = left + 1
            var smallest = parent
            if left < items.count, items[left].at < items[smallest].at { smallest = left }
            if right < items.count, items[right].at < items[smallest].at { smallest = right }
            if smallest == parent { return }
            items.swapAt(parent, smallest)
            parent = smallest
        }
    }
}

extension DeadlineHeap: Sendable where Entry: Sendable {}
