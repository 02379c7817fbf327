/// A set that keeps a single element inline and allocates a `Set` only from the second one on.
///
/// The server's indexes hold one such set per channel or per uuid — the long-polls waiting on a
/// channel, the channels a uuid is present on — and most of them hold one element: a user's own
/// inbox channel, a uuid present on one channel. A `Set` of one element is a ~80-byte hash table
/// of its own; this keeps that element in place (docs/benchmarks.md, issue #16's seventh pass).
/// A set that shrinks back to one element keeps it inline again.
package struct CompactSet<Element: Hashable>: Sequence, ExpressibleByArrayLiteral {
    fileprivate enum Storage {
        case empty
        case one(Element)
        case many(Set<Element>)
    }

    private var storage = Storage.empty

    /// An empty set.
    package init() {}

    package init(arrayLiteral elements: Element...) {
        for element in elements { insert(element) }
    }

    package var isEmpty: Bool {
        if case .empty = storage { return true }
        return false
    }

    package var count: Int {
        switch storage {
        case .empty: 0
        case .one: 1
        case .many(let set): set.count
        }
    }

    package func contains(_ element: Element) -> Bool {
        switch storage {
        case .empty: false
        case .one(let only): only == element
        case .many(let set): set.contains(element)
        }
    }

    /// Adds `element`; returns whether it was not there yet.
    @discardableResult
    package mutating func insert(_ element: Element) -> Bool {
        switch storage {
        case .empty:
            storage = .one(element)
            return true
        case .one(let only):
            guard only != element else { return false }
            storage = .many([only, element])
            return true
        case .many(var set):
            storage = .empty  // so `set` is the only reference and grows in place
            let inserted = set.insert(element).inserted
            storage = .many(set)
            return inserted
        }
    }

    /// Removes `element`; returns it if it was there.
    @discardableResult
    package mutating func remove(_ element: Element) -> Element? {
        switch storage {
        case .empty:
            return nil
        case .one(let only):
            guard only == element else { return nil }
            storage = .empty
            return only
        case .many(var set):
            storage = .empty
            let removed = set.remove(element)
            storage = set.count == 1 ? .one(set.first!) : .many(set)
            return removed
        }
    }

    package func makeIterator() -> Iterator {
        switch storage {
        case .empty: Iterator(state: .one(nil))
        case .one(let only): Iterator(state: .one(only))
        case .many(let set): Iterator(state: .many(set.makeIterator()))
        }
    }

    package var underestimatedCount: Int { count }

    package struct Iterator: IteratorProtocol {
        fileprivate enum State {
            case one(Element?)
            case many(Set<Element>.Iterator)
        }

        fileprivate var state: State

        package mutating func next() -> Element? {
            switch state {
            case .one(let element):
                state = .one(nil)
                return element
            case .many(var iterator):
                let element = iterator.next()
                state = .many(iterator)
                return element
            }
        }
    }
}

extension CompactSet: Sendable where Element: Sendable {}
extension CompactSet.Storage: Sendable where Element: Sendable {}

extension CompactSet: Equatable {
    package static func == (lhs: CompactSet, rhs: CompactSet) -> Bool {
        lhs.count == rhs.count && lhs.allSatisfy(rhs.contains)
    }
}
